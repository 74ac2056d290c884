// The official `openai` npm package against specd's HTTP API, as a user would call it: greedy
// completions and chat, each non-streaming and streaming (stream_options.include_usage), plus
// one chat with logprobs; the model list, and the served model retrieved by its id.
//
// usage: node openai_client.mjs SOURCE_DIR BASE_URL MODEL PROMPT
// prints one JSON object: {"completion": {...}, "completion_stream": {...}, "chat": {...},
// "chat_stream": {...}} with each call's text, finish_reason and usage.
import { createRequire } from 'node:module';
import path from 'node:path';

const [sourceDir, baseURL, model, prompt] = process.argv.slice(2);
const require = createRequire(path.join(sourceDir, 'package.json'));
const { OpenAI } = require('openai');

// No key is configured on the test server; the SDK insists on one.
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const common = { model, temperature: 0, max_tokens: 16, num_speculative_tokens: 4, ignore_eos: true };
const messages = [{ role: 'user', content: prompt }];

const out = {};
const completion = await client.completions.create({ ...common, prompt });
out.completion = {
  text: completion.choices[0].text,
  finish_reason: completion.choices[0].finish_reason,
  usage: completion.usage,
};

let text = '';
let usage = null;
let finish = null;
for await (const chunk of await client.completions.create({
  ...common, prompt, stream: true, stream_options: { include_usage: true },
})) {
  for (const c of chunk.choices) {
    text += c.text;
    finish = c.finish_reason ?? finish;
  }
  if (chunk.usage) usage = chunk.usage;
}
out.completion_stream = { text, finish_reason: finish, usage };

const chat = await client.chat.completions.create({
  ...common, messages, logprobs: true, top_logprobs: 2,
});
out.chat = {
  text: chat.choices[0].message.content,
  role: chat.choices[0].message.role,
  finish_reason: chat.choices[0].finish_reason,
  usage: chat.usage,
  logprobs: chat.choices[0].logprobs.content.map((t) => ({
    token: t.token, logprob: t.logprob, top: t.top_logprobs.map((a) => a.logprob),
  })),
};

text = '';
usage = null;
finish = null;
let role = null;
for await (const chunk of await client.chat.completions.create({
  ...common, messages, stream: true, stream_options: { include_usage: true },
})) {
  for (const c of chunk.choices) {
    role = c.delta.role ?? role;
    text += c.delta.content ?? '';
    finish = c.finish_reason ?? finish;
  }
  if (chunk.usage) usage = chunk.usage;
}
out.chat_stream = { text, role, finish_reason: finish, usage };

const models = await client.models.list();
out.models = models.data.map((m) => m.id);
out.retrieved = (await client.models.retrieve(model)).id;
console.log(JSON.stringify(out));
