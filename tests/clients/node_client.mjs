// A Node.js client of specd.v1.Generation, as a user would write one: @grpc/grpc-js with the
// .proto loaded at run time by @grpc/proto-loader.
//
// usage: node node_client.mjs SOURCE_DIR ADDRESS MAX_NEW_TOKENS TOKEN_ID [TOKEN_ID ...]
// prints one JSON object: {"token_ids": [...], "text": "...", "finish_reason": "..."}
import { createRequire } from 'node:module';
import path from 'node:path';

const [sourceDir, address, maxNew, ...ids] = process.argv.slice(2);
const require = createRequire(path.join(sourceDir, 'package.json'));
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const definition = protoLoader.loadSync('specd/v1/generation.proto', {
  includeDirs: [path.join(sourceDir, 'proto')],
  keepCase: true,
  enums: String,
  longs: Number,
  defaults: true,
});
const specd = grpc.loadPackageDefinition(definition).specd.v1;
const client = new specd.Generation(address, grpc.credentials.createInsecure());

const call = client.Generate(
  {
    token_ids: { ids: ids.map(Number) },
    stopping: { max_new_tokens: Number(maxNew), ignore_eos: true },
    speculation: { num_speculative_tokens: 3 },
  },
  { deadline: Date.now() + 60000 },
);
const tokens = [];
let text = '';
let finish = '';
call.on('data', (msg) => {
  tokens.push(...msg.token_ids);
  text += msg.text;
  if (msg.finish_reason !== 'FINISH_REASON_UNSPECIFIED') finish = msg.finish_reason;
});
call.on('error', (err) => {
  console.error(`node client: ${err.message}`);
  process.exit(1);
});
call.on('end', () => {
  console.log(JSON.stringify({ token_ids: tokens, text, finish_reason: finish }));
  client.close();
});
