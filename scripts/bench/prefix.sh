#!/usr/bin/env bash
# The prefix-caching and chunked-prefill benchmarks behind docs/benchmarks.md, on a synthetic
# $SHAPE target (stories110M: 1024-token context) with its $DRAFT_LAYERS-layer early-exit draft.
# Each runs `specd bench --scenario` on two servers side by side, alternating between them:
#   1. shared-prefix: an 800-token shared prefix, then 8 requests with their own 64-token suffix,
#      one at a time: TTFT with prefix caching on against off;
#   2. chat: 8 conversations x 6 turns, each turn resending its history: throughput and TTFT
#      p50/p99, prefix caching on against off;
#   3. long-prompts: ITL p99 of 8 decoding streams while 800-token prompts arrive one after
#      another, --prefill-chunk $CHUNK against 0 (each prompt in one round);
#   4. burst: $BURST requests that share a new $PREFIX_TOKENS-token prefix, each with its own
#      64-token suffix, all at once: TTFT and throughput, --prefix-sharing on against off (both
#      with prefix caching on); then chat (as in 2) on the same two servers, where the shared
#      system prompt is cached long before most turns: what sharing costs when nothing is to share.
# JSON goes to $OUT, one file per scenario. SCENARIOS picks which run.
#
# usage: scripts/bench/prefix.sh            (environment variables below override the defaults)
#   QUICK=1 scripts/bench/prefix.sh        (tiny shape, short runs: checks the pipeline)
set -euo pipefail
cd "$(dirname "$0")/../.."

SPECD="${SPECD:-${SPECD_BUILD_DIR:-build}/tools/specd}"
OUT="${OUT:-bench-out/prefix}"
if [[ "${QUICK:-0}" == 1 ]]; then
  SHAPE="${SHAPE:-tiny}" PREFIX_TOKENS="${PREFIX_TOKENS:-200}" LONG_TOKENS="${LONG_TOKENS:-200}"
  SYSTEM_TOKENS="${SYSTEM_TOKENS:-48}" USER_TOKENS="${USER_TOKENS:-16}" TURNS="${TURNS:-3}"
  STREAM_TOKENS="${STREAM_TOKENS:-48}" CHUNK="${CHUNK:-32}"
fi
SHAPE="${SHAPE:-stories110M}"
DRAFT_LAYERS="${DRAFT_LAYERS:-2}"
THREADS="${THREADS:-2}"          # CPU threads per worker
K="${K:-4}"
REPEATS="${REPEATS:-1}"
PREFIX_TOKENS="${PREFIX_TOKENS:-800}"
SYSTEM_TOKENS="${SYSTEM_TOKENS:-160}"
USER_TOKENS="${USER_TOKENS:-48}"
TURNS="${TURNS:-6}"
LONG_TOKENS="${LONG_TOKENS:-800}"
STREAM_TOKENS="${STREAM_TOKENS:-160}"
CHUNK="${CHUNK:-128}"            # the chunked server's --prefill-chunk in long-prompts
BURST="${BURST:-8}"              # requests in the burst scenario
SCENARIOS="${SCENARIOS:-shared-prefix chat long-prompts burst}"  # which to run

[[ -x "$SPECD" ]] || { echo "prefix: no specd at $SPECD (build it, or set SPECD)" >&2; exit 1; }
mkdir -p "$OUT"
BENCH_NAME=prefix
source scripts/bench/lib.sh
MODEL="$OUT/models/$SHAPE"
synth_once "$MODEL" "$SHAPE" 0.1

# start_server FLAGS...: one more `specd serve` of the model; its address joins $addresses.
start_server() {
  serve --target "$MODEL" --draft-exit-layer "$DRAFT_LAYERS" --threads "$THREADS" \
    --kv-tokens 32768 --max-running 32 --default-k "$K" "$@"
}

common=(--k "$K" --repeats "$REPEATS" --seed 1)

wants() { [[ " $SCENARIOS " == *" $1 "* ]]; }

if wants shared-prefix || wants chat; then
  echo "prefix: prefix caching on (a) against off (b)" >&2
  start_server --prefix-caching on
  start_server --prefix-caching off
  if wants shared-prefix; then
    "$SPECD" bench --scenario shared-prefix --server "${addresses[0]}" \
      --baseline "${addresses[1]}" "${common[@]}" --prefix-tokens "$PREFIX_TOKENS" \
      --suffix-tokens 64 --prefix-requests 8 --answer-tokens 16 --json "$OUT/shared_prefix.json"
  fi
  if wants chat; then
    "$SPECD" bench --scenario chat --server "${addresses[0]}" --baseline "${addresses[1]}" \
      "${common[@]}" --conversations 8 --turns "$TURNS" --system-tokens "$SYSTEM_TOKENS" \
      --user-tokens "$USER_TOKENS" --reply-tokens 32 --json "$OUT/chat.json"
  fi
  stop_servers
fi

if wants long-prompts; then
  echo "prefix: --prefill-chunk $CHUNK (a) against 0 (b)" >&2
  start_server --prefill-chunk "$CHUNK"
  start_server --prefill-chunk 0
  "$SPECD" bench --scenario long-prompts --server "${addresses[0]}" --baseline "${addresses[1]}" \
    "${common[@]}" --decode-streams 8 --stream-tokens "$STREAM_TOKENS" \
    --long-prompt-tokens "$LONG_TOKENS" --answer-tokens 8 --long-prompt-gap 0.5 \
    --json "$OUT/long_prompts_chunk$CHUNK.json"
  stop_servers
fi
if wants burst; then
  echo "prefix: --prefix-sharing on (a) against off (b)" >&2
  start_server --prefix-sharing on
  start_server --prefix-sharing off
  "$SPECD" bench --scenario burst --server "${addresses[0]}" --baseline "${addresses[1]}" \
    "${common[@]}" --prefix-tokens "$PREFIX_TOKENS" --suffix-tokens 64 --prefix-requests "$BURST" \
    --answer-tokens 16 --json "$OUT/burst.json"
  "$SPECD" bench --scenario chat --server "${addresses[0]}" --baseline "${addresses[1]}" \
    "${common[@]}" --conversations 8 --turns "$TURNS" --system-tokens "$SYSTEM_TOKENS" \
    --user-tokens "$USER_TOKENS" --reply-tokens 32 --json "$OUT/chat_sharing.json"
  stop_servers
fi
echo "prefix: done; JSON in $OUT" >&2
