// Hugging Face `tokenizers` (the Rust library, through its official Node bindings) as the
// reference for a tokenizer directory: encodes every corpus string, decodes the ids back, and
// decodes seeded random id sequences that are rich in byte tokens (so they include invalid and
// truncated UTF-8) for the decode and streaming tests.
//
//   node hf_reference.mjs --tokenizer-dir DIR --corpus corpus.jsonl --out expected.json
//
// Encoding matches specd's defaults: special tokens written in the text are NOT parsed
// (EncodeOptions.parse_special = false) and no BOS is added. The Rust library always splits on
// added tokens, so encoding uses an instance without them; no added token of Llama 2 or 3 can
// be produced by its BPE model from text, so this is exactly "added tokens not parsed".
// `ids_parse_special` is the encoding with them parsed, where it differs. Decoding keeps special
// tokens unless asked; the Rust library never applies transformers' clean_up_tokenization_spaces.
import { existsSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

const require = createRequire(import.meta.url);
const { Tokenizer } = require("tokenizers");

const RANDOM_SEED = 12345;
const RANDOM_SEQUENCES = 300;

// mulberry32: a tiny seeded PRNG, so the random id sequences are the same on every run.
function makeRng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// The packages' "exports" may hide package.json, so walk up from the resolved entry point.
export function packageVersion(name) {
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

export function readCorpus(path) {
  return readFileSync(path, "utf8")
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line) => JSON.parse(line).text);
}

export function writeJsonAtomically(path, value) {
  const tmp = `${path}.tmp${process.pid}`;
  writeFileSync(tmp, JSON.stringify(value));
  renameSync(tmp, path);
}

// The id of the token that stands for one raw byte: "<0xNN>" with byte fallback (Llama 2), or
// the GPT-2 byte-level character (Llama 3).
function byteTokenIds(vocab) {
  if (vocab["<0x80>"] !== undefined) {
    return Array.from({ length: 256 }, (_, b) =>
      vocab[`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`]);
  }
  let extra = 0;
  return Array.from({ length: 256 }, (_, b) => {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    return vocab[String.fromCodePoint(printable ? b : 256 + extra++)];
  });
}

function randomSequences(modelVocab, addedIds) {
  const rng = makeRng(RANDOM_SEED);
  const pick = (list) => list[Math.floor(rng() * list.length)];
  const byteId = byteTokenIds(modelVocab);
  if (byteId.some((id) => id === undefined)) throw new Error("vocabulary lacks a byte token");
  const leads = byteId.slice(0xc2, 0xf5);
  const conts = byteId.slice(0x80, 0xc0);
  const modelSize = Object.keys(modelVocab).length;
  const sequences = [];
  for (let s = 0; s < RANDOM_SEQUENCES; ++s) {
    const seq = [];
    const n = 1 + Math.floor(rng() * 24);
    for (let i = 0; i < n; ++i) {
      const r = rng();
      if (r < 0.4) seq.push(Math.floor(rng() * modelSize));
      else if (r < 0.6) seq.push(pick(leads));
      else if (r < 0.85) seq.push(pick(conts));
      else if (r < 0.93) seq.push(pick(byteId));
      else seq.push(pick(addedIds));
    }
    sequences.push(seq);
  }
  // Valid multi-byte characters spelled byte by byte, then cut short, followed by a stray byte,
  // or missing their first byte between two words.
  const word = modelVocab["Ġthe"] ?? modelVocab["▁the"];
  const encoder = new TextEncoder();
  for (const text of ["你好", "é", "😀", "a€b", "ह"]) {
    const spelled = Array.from(encoder.encode(text), (b) => byteId[b]);
    sequences.push(spelled);
    sequences.push(spelled.slice(0, -1));
    sequences.push([...spelled, byteId[0xff]]);
    sequences.push([word, ...spelled.slice(1), word]);
  }
  return sequences;
}

// Everything the parity test compares against, for one tokenizer directory.
export async function hfReference(tokenizerDir, texts) {
  const json = JSON.parse(readFileSync(join(tokenizerDir, "tokenizer.json"), "utf8"));
  const full = Tokenizer.fromString(JSON.stringify(json));
  const encoder = Tokenizer.fromString(JSON.stringify({ ...json, added_tokens: [] }));
  const decode = (ids, skipSpecial) => full.decode(ids, skipSpecial);
  const encode = async (tokenizer, text, addSpecialTokens) =>
    Array.from((await tokenizer.encode(text, null, { addSpecialTokens })).getIds());

  const corpus = [];
  for (const text of texts) {
    const ids = await encode(encoder, text, false);
    const entry = { ids, decoded: await decode(ids, false) };
    // With special tokens parsed (specd's parse_special), only where that changes anything.
    const idsParseSpecial = await encode(full, text, false);
    if (JSON.stringify(idsParseSpecial) !== JSON.stringify(ids)) entry.ids_parse_special = idsParseSpecial;
    corpus.push(entry);
  }
  const addedIds = json.added_tokens.map((t) => t.id);
  const randomIds = [];
  for (const ids of randomSequences(json.model.vocab, addedIds)) {
    randomIds.push({
      ids,
      decoded: await decode(ids, false),
      decoded_skip_special: await decode(ids, true),
    });
  }
  // BOS/EOS as tokenizer_config.json names them (a string or an AddedToken object).
  const configPath = join(tokenizerDir, "tokenizer_config.json");
  const config = existsSync(configPath) ? JSON.parse(readFileSync(configPath, "utf8")) : {};
  const tokenId = (token) => {
    const content = typeof token === "object" && token !== null ? token.content : token;
    return typeof content === "string" ? full.tokenToId(content) ?? null : null;
  };
  // What the library adds by default (its post-processor) to a plain string.
  const plain = await encode(full, "Hello world", false);
  const withDefaults = await encode(full, "Hello world", true);
  return {
    reference: `tokenizers (Hugging Face, Node bindings) ${packageVersion("tokenizers")}`,
    default_prefix_ids: withDefaults.slice(0, withDefaults.length - plain.length),
    vocab_size: full.getVocabSize(true),
    bos_id: tokenId(config.bos_token),
    eos_id: tokenId(config.eos_token),
    special_ids: json.added_tokens.filter((t) => t.special).map((t) => t.id),
    corpus,
    random_ids: randomIds,
  };
}

async function main() {
  const { values: args } = parseArgs({
    options: {
      "tokenizer-dir": { type: "string" },
      corpus: { type: "string" },
      out: { type: "string" },
    },
  });
  if (!args["tokenizer-dir"] || !args.corpus || !args.out) {
    console.error("usage: node hf_reference.mjs --tokenizer-dir DIR --corpus corpus.jsonl --out expected.json");
    process.exit(2);
  }
  const result = await hfReference(args["tokenizer-dir"], readCorpus(args.corpus));
  writeJsonAtomically(args.out, result);
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  await main();
}
