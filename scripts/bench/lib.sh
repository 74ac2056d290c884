# shellcheck shell=bash
# Sourced by the benchmark scripts in this folder: synthetic models written once, and `specd
# serve` instances started on free ports and stopped on exit. The caller sets BENCH_NAME (the
# prefix of its messages) and, for `serve` and `synth_once`, SPECD (the specd binary).

bench_pids=()
bench_logs=()
addresses=()  # every running server's address, in start order
address=""    # the last one started

# serve ARGS...: `$SPECD serve --listen 127.0.0.1:0 ARGS` in the background, running alongside
# any servers already started; returns once it listens, with its address in $address.
serve() {
  serve_with "$SPECD" "$@"
}

# serve_with SPECD_BINARY ARGS...: serve, with another build's specd.
serve_with() {
  local specd=$1 log
  shift
  log=$(mktemp)
  "$specd" serve --listen 127.0.0.1:0 "$@" >"$log" 2>&1 &
  bench_pids+=($!)
  bench_logs+=("$log")
  # Loading a large synthetic model on a busy machine takes a while: wait up to 3 minutes.
  for _ in $(seq 1 1800); do
    grep -q "^listening on" "$log" && break
    if ! kill -0 "${bench_pids[-1]}" 2>/dev/null; then
      echo "$BENCH_NAME: specd serve $* failed:" >&2
      cat "$log" >&2
      exit 1
    fi
    sleep 0.1
  done
  address=$(sed -n 's/^listening on //p' "$log")
  if [[ -z "$address" ]]; then
    echo "$BENCH_NAME: specd serve $* did not listen within 3 minutes" >&2
    exit 1
  fi
  addresses+=("$address")
}

# stop_servers: stops every server started (SIGINT: each drains and stops its workers).
stop_servers() {
  local p l
  for p in "${bench_pids[@]+"${bench_pids[@]}"}"; do kill -INT "$p" 2>/dev/null || true; done
  for p in "${bench_pids[@]+"${bench_pids[@]}"}"; do wait "$p" 2>/dev/null || true; done
  for l in "${bench_logs[@]+"${bench_logs[@]}"}"; do rm -f "$l"; done
  bench_pids=() bench_logs=() addresses=()
  address=""
}
trap stop_servers EXIT

# synth_once DIR SHAPE SCALE: writes a `specd synth` target of that shape and residual scale
# (seed 1) to DIR unless one is there already.
synth_once() {
  [[ -f "$1/config.json" ]] ||
    "$SPECD" synth --shape "$2" --residual-scale "$3" --seed 1 --out "$1" >&2
}
