// The official `openai` npm package's ChatCompletionStream, assembling a chat stream's chunks
// into the final ChatCompletion as an SDK user receives it: content concatenated, tool-call
// deltas merged by index. It throws where a tool call lacks its id, type, name or arguments.
//
// usage: node openai_stream_assembly.mjs SOURCE_DIR < CHUNKS.ndjson   (one chunk per line)
// prints the assembled ChatCompletion as JSON.
import { createRequire } from 'node:module';
import path from 'node:path';

const [sourceDir] = process.argv.slice(2);
const require = createRequire(path.join(sourceDir, 'package.json'));
const { ChatCompletionStream } = require('openai/lib/ChatCompletionStream');

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const bytes = new TextEncoder().encode(Buffer.concat(chunks).toString('utf8'));
const readable = new ReadableStream({
  start(controller) {
    controller.enqueue(bytes);
    controller.close();
  },
});
const stream = ChatCompletionStream.fromReadableStream(readable);
const completion = await stream.finalChatCompletion();
process.stdout.write(JSON.stringify(completion));
