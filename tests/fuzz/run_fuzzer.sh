#!/bin/bash
# Builds one libFuzzer target with clang++ (-fsanitize=fuzzer,address,undefined) and runs it for
# a bounded time over the committed seed corpus. The main build uses g++, so the fuzzers are
# compiled here, from the parser sources, into WORK_DIR; a rebuild happens only when a source
# changed.
#
#   run_fuzzer.sh TARGET WORK_DIR SECONDS
#     TARGET: safetensors_header | model_config
#     CXX (env): the clang++ to use (default clang++)
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 safetensors_header|model_config WORK_DIR SECONDS" >&2
  exit 2
fi
target=$1
work=$2
seconds=$3
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cxx=${CXX:-clang++}

case "$target" in
  safetensors_header)
    sources=("$src/common/model/safetensors.cc")
    corpus=safetensors
    ;;
  model_config)
    sources=("$src/common/model/config.cc" "$src/common/model/mapped_file.cc")
    corpus=model_config
    ;;
  *)
    echo "run_fuzzer.sh: unknown target '$target'" >&2
    exit 2
    ;;
esac
sources+=("$src/tests/fuzz/${target}_fuzzer.cc" "$src/kernels/dtype.cc")

mkdir -p "$work/obj" "$work/corpus" "$work/artifacts"
binary="$work/${target}_fuzzer"
flags=(-std=c++20 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=all -I"$src")
# Debian's Abseil ships pkg-config files; the .a/.so were built with g++ but share its ABI.
read -r -a absl_cflags <<<"$(pkg-config --cflags absl_status absl_statusor absl_strings)"
read -r -a absl_libs <<<"$(pkg-config --libs absl_status absl_statusor absl_strings)"

objects=()
for s in "${sources[@]}"; do
  o="$work/obj/$(basename "${s%.cc}").o"
  objects+=("$o")
  # Headers can change too: rebuild an object when any source or header under common/, kernels/
  # or tests/fuzz/ is newer than it.
  if [[ ! -f "$o" || -n "$(find "$s" "$src/common/model" "$src/common/util" "$src/kernels" \
        "$src/tests/fuzz" -name '*.h' -newer "$o" -o -name "$(basename "$s")" -newer "$o" |
        head -n 1)" ]]; then
    echo "compiling $s"
    "$cxx" "${flags[@]}" "${absl_cflags[@]}" -c "$s" -o "$o"
  fi
done
"$cxx" "${flags[@]}" "${objects[@]}" "${absl_libs[@]}" -o "$binary"

dict="$src/tests/fuzz/$corpus.dict"
# New inputs go to the first (writable) corpus directory; the committed seeds stay untouched.
exec "$binary" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -max_len=16384 \
  -dict="$dict" -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
  "$work/corpus" "$src/tests/fuzz/corpus/$corpus"
