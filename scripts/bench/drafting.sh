#!/usr/bin/env bash
# The benchmarks of issue 17 (docs/benchmarks.md, "More ways to draft"), each a `specd bench
# --compare` run whose arms alternate on one server, so every ratio is measured side by side:
#   1. trees against chains at an equal number of verified tokens, on the stories110M-shape pairs
#      at alpha ~ 0.5 and 0.7 (2-layer early-exit drafts), one stream;
#   2. EGAG on and off on the same pairs, against the best fixed chains (K = 1, 2);
#   3. FR-Spec: the alpha ~ 0.7 pair's draft with a reduced head of $DRAFT_VOCAB tokens ranked by
#      a frequency file measured from the target's own generations (`specd token-freq` on
#      scripts/bench/frspec_prompts.txt, prompts the benchmark itself never uses), against the
#      full head;
#   4. prompt lookup on a copy-heavy workload: stories260K continuing stories it was given (its
#      own greedy stories from the shared golden file, followed by their first words).
# usage: scripts/bench/drafting.sh [trees|egag|frspec|ngram ...]   (default: all four)
#   scripts/bench/drafting_summary.py prints the tables of docs/benchmarks.md from the JSON.
#   SPECD, OUT, MODELS, THREADS, MAX_TOKENS, REPEATS, REQUESTS, SHARED, DRAFT_VOCAB,
#   FREQ_TEMPERATURES override the defaults.
set -euo pipefail
cd "$(dirname "$0")/../.."

SPECD="${SPECD:-${SPECD_BUILD_DIR:-build}/tools/specd}"
OUT="${OUT:-bench-out/drafting}"
MODELS="${MODELS:-bench-out/models}"
SHARED="${SHARED:-${SPECD_SHARED_DIR:-../shared}}"
THREADS="${THREADS:-2}"
MAX_TOKENS="${MAX_TOKENS:-96}"
REPEATS="${REPEATS:-2}"
REQUESTS="${REQUESTS:-4}"
DRAFT_VOCAB="${DRAFT_VOCAB:-8192}"
FREQ_TEMPERATURES="${FREQ_TEMPERATURES:-1 0}"  # token-freq's sampling temperature(s)
# Residual scales that gave alpha ~ 0.5 and ~ 0.7 for the 2-layer draft (docs/benchmarks.md).
SCALE_05="${SCALE_05:-0.1206}"
SCALE_07="${SCALE_07:-0.06877}"
PARTS=("$@")
[[ ${#PARTS[@]} -eq 0 ]] && PARTS=(trees egag frspec ngram)
mkdir -p "$OUT" "$MODELS"

BENCH_NAME=drafting
source scripts/bench/lib.sh

# start_server ARGS...: `specd serve ARGS` alone; sets $address.
start_server() {
  stop_servers
  serve --threads "$THREADS" --kv-tokens 16384 "$@"
}

model_for() {  # model_for SCALE: the stories110M-shape target with that residual scale
  local dir="$MODELS/stories110M-s$1"
  synth_once "$dir" stories110M "$1"
  echo "$dir"
}

bench() {  # bench NAME ARMS: one stream, arms alternating with K = 0
  "$SPECD" bench --server "$address" --compare --arms "$2" --streams 1 --requests "$REQUESTS" \
    --max-tokens "$MAX_TOKENS" --repeats "$REPEATS" --warmup 1 --quiet --json "$OUT/$1.json"
}

for part in "${PARTS[@]}"; do
  case "$part" in
    trees)
      # Equal verified tokens: a 2x1 tree of depth 3 verifies 6 nodes, a 2x2 one 10; chains of
      # K = 3 (the trees' depth), 6 and 10, and K = 2 (the best chain at these alphas).
      for alpha in 05 07; do
        scale_var="SCALE_$alpha"
        start_server --target "$(model_for "${!scale_var}")" --draft-exit-layer 2
        bench "trees_alpha$alpha" "k=2;k=3;k=3,tree=2x1;k=6;k=3,tree=2x2;k=10"
      done
      ;;
    egag)
      for alpha in 05 07; do
        scale_var="SCALE_$alpha"
        start_server --target "$(model_for "${!scale_var}")" --draft-exit-layer 2
        # K = 1 and 2 too: the best fixed chains here, which EGAG has to beat to pay.
        bench "egag_alpha$alpha" "k=1;k=2;k=4,no-egag;k=4,egag;k=8,no-egag;k=8,egag"
      done
      ;;
    frspec)
      # The frequency file from the target's own generations, sampled (temperature 1, two
      # samples per prompt) and greedy (one); the benchmark's requests are greedy.
      target=$(model_for "$SCALE_07")
      start_server --target "$target" --draft-exit-layer 2
      bench frspec_full_head "k=2;k=4"
      for t in $FREQ_TEMPERATURES; do
        freq="$OUT/token_freq_stories110M-s$SCALE_07-t$t.tsv"
        samples=2
        [[ "$t" == 0 ]] && samples=1
        [[ -f "$freq" ]] || "$SPECD" token-freq --model "$target" \
          --prompts scripts/bench/frspec_prompts.txt --samples "$samples" --temperature "$t" \
          --max-tokens 96 --threads "$THREADS" --out "$freq"
        start_server --target "$target" --draft-exit-layer 2 --draft-vocab "$DRAFT_VOCAB" \
          --draft-vocab-file "$freq"
        bench "frspec_head${DRAFT_VOCAB}_t$t" "k=2;k=4"
      done
      ;;
    ngram)
      model="$MODELS/stories260K"
      if [[ ! -f "$model/config.json" ]]; then
        "$SPECD" convert llama2c --checkpoint "$SHARED/models/stories260K/stories260K.bin" \
          --tokenizer "$SHARED/models/stories260K/tok512.bin" --out "$model" >&2
      fi
      # Each prompt: one of the model's own greedy stories, then that story's first words again.
      /usr/bin/python3 - "$SHARED/models/stories260K/golden-greedy.json" "$OUT/copy_prompts.jsonl" <<'PY'
import json, sys
cases = json.load(open(sys.argv[1]))["cases"]
with open(sys.argv[2], "w") as out:
    for c in cases:
        story = c["text"].strip()
        head = " ".join(story.split()[:4])
        out.write(json.dumps({"prompt": story + "\n" + head}) + "\n")
PY
      start_server --target "$model" --draft-method ngram --ngram-min 1 --ngram-max 4
      "$SPECD" bench --server "$address" --compare --arms "k=2,ngram;k=4,ngram;k=8,ngram" \
        --streams 1 --requests 8 --max-tokens 128 --repeats 3 --warmup 2 --quiet \
        --prompts "$OUT/copy_prompts.jsonl" --json "$OUT/ngram_stories260K.json"
      ;;
    *) echo "drafting: unknown part '$part' (trees, egag, frspec, ngram)" >&2; exit 2 ;;
  esac
done
stop_servers
echo "drafting: done; JSON in $OUT" >&2
