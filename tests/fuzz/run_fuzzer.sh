#!/bin/bash
# Builds one libFuzzer target with clang++ (-fsanitize=fuzzer,address,undefined) and runs it for
# a bounded time over the committed seed corpus. The main build uses g++, so the fuzzers are
# compiled here, from the library sources, into WORK_DIR; a rebuild happens only when a source
# changed.
#
#   run_fuzzer.sh TARGET WORK_DIR SECONDS
#     TARGET: safetensors_header | model_config | tokenizer | request | chat_template |
#             openai_request
#     CXX (env): the clang++ to use (default clang++)
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 safetensors_header|model_config|tokenizer|request|chat_template|openai_request" \
       "WORK_DIR SECONDS" >&2
  exit 2
fi
target=$1
work=$2
seconds=$3
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cxx=${CXX:-clang++}
gen=$(dirname "$work")/proto  # generated sources, shared by the targets

tokenizer_sources=()
for s in added_tokens bpe byte_level decoder incremental_detokenizer json_fields llama2c_import \
         normalizer pre_tokenizer regex sha256 tokenizer tokenizer_config tokenizer_json utf8; do
  tokenizer_sources+=("$src/common/tokenizer/$s.cc")
done
tokenizer_sources+=("$src/base/utf8.cc")
chat_sources=()
for s in builtins chat_template interpreter js_text lexer parser value; do
  chat_sources+=("$src/common/chat/$s.cc")
done

# Per target: the sources to compile, the directories whose headers they include (a newer header
# forces a rebuild), the pkg-config modules to link, and the corpus/dictionary name.
pkgs=(absl_status absl_statusor absl_strings)
case "$target" in
  safetensors_header)
    sources=("$src/common/model/safetensors.cc" "$src/kernels/dtype.cc")
    header_dirs=("$src/common/model" "$src/base" "$src/kernels")
    ;;
  model_config)
    sources=("$src/common/model/config.cc" "$src/common/model/mapped_file.cc"
             "$src/kernels/dtype.cc")
    header_dirs=("$src/common/model" "$src/base" "$src/kernels")
    ;;
  tokenizer)
    sources=("${tokenizer_sources[@]}")
    header_dirs=("$src/common/tokenizer" "$src/base" "$src/tests/common/tokenizer")
    pkgs+=(absl_flat_hash_map absl_flat_hash_set absl_synchronization absl_str_format
           libpcre2-8 libcrypto)
    ;;
  request | openai_request)
    # The public proto's C++ is generated once for both targets, as the main build does with its
    # own protoc rule.
    mkdir -p "$gen/specd/v1"
    proto="$src/proto/specd/v1/generation.proto"
    if [[ ! -f "$gen/specd/v1/generation.pb.cc" ||
          "$proto" -nt "$gen/specd/v1/generation.pb.cc" ]]; then
      protoc --proto_path="$src/proto" --cpp_out="$gen" "$proto"
    fi
    sources=("$gen/specd/v1/generation.pb.cc"
             "$src/services/coordinator/request_validation.cc"
             "$src/services/coordinator/tool_calls.cc"
             "$src/common/protocol/draft_tree.cc"
             "$src/base/sampling_params.cc" "${tokenizer_sources[@]}")
    header_dirs=("$src/services" "$src/common" "$src/base" "$src/tests/common/tokenizer"
                 "$gen")
    pkgs+=(absl_flat_hash_map absl_flat_hash_set absl_synchronization absl_str_format
           libpcre2-8 libcrypto protobuf)
    if [[ "$target" == openai_request ]]; then
      sources+=("${chat_sources[@]}" "$src/services/coordinator/chat_prompt.cc"
                "$src/services/coordinator/http/openai_request.cc")
      pkgs+=(absl_time)
    fi
    ;;
  chat_template)
    sources=("${chat_sources[@]}" "$src/base/utf8.cc")
    header_dirs=("$src/common/chat" "$src/base")
    pkgs+=(absl_flat_hash_map absl_str_format absl_time)
    ;;
  *)
    echo "run_fuzzer.sh: unknown target '$target'" >&2
    exit 2
    ;;
esac
sources+=("$src/tests/fuzz/${target}_fuzzer.cc")
header_dirs+=("$src/tests/fuzz")

# Objects are shared by the targets (the tokenizer sources serve two of them), next to the work
# directories; each is written under a temporary name and renamed, so fuzz tests that run in
# parallel never see half-written objects.
obj_dir=$(dirname "$work")/obj
mkdir -p "$obj_dir" "$work/corpus" "$work/artifacts"
binary="$work/${target}_fuzzer"
# Line tables are all that sanitizer reports need; full debug info only slows the compile.
flags=(-std=c++20 -gline-tables-only -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=all -I"$src" -I"$gen")
# Debian's Abseil and protobuf ship pkg-config files; the libraries were built with g++ but share
# its ABI.
read -r -a pkg_cflags <<<"$(pkg-config --cflags "${pkgs[@]}")"
read -r -a pkg_libs <<<"$(pkg-config --libs "${pkgs[@]}")"

objects=()
for s in "${sources[@]}"; do
  rel=${s#"$src/"}
  rel=${rel#"$gen/"}
  o="$obj_dir/$(tr / _ <<<"${rel%.cc}").o"
  objects+=("$o")
  if [[ ! -f "$o" || -n "$(find "$s" "${header_dirs[@]}" -name '*.h' -newer "$o" -o \
        -name "$(basename "$s")" -newer "$o" | head -n 1)" ]]; then
    echo "compiling $s"
    "$cxx" "${flags[@]}" "${pkg_cflags[@]}" -c "$s" -o "$o.$$.tmp"
    mv -f "$o.$$.tmp" "$o"
  fi
done
"$cxx" "${flags[@]}" "${objects[@]}" "${pkg_libs[@]}" -o "$binary"

# The tokenizer's seeds are whole tokenizer.json files; the other inputs are small.
max_len=16384
[[ "$target" == tokenizer ]] && max_len=32768
dict="$src/tests/fuzz/$target.dict"
[[ "$target" == safetensors_header ]] && dict="$src/tests/fuzz/safetensors.dict"
corpus=$target
[[ "$target" == safetensors_header ]] && corpus=safetensors
# New inputs go to the first (writable) corpus directory; the committed seeds stay untouched.
exec "$binary" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -max_len="$max_len" \
  -dict="$dict" -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
  "$work/corpus" "$src/tests/fuzz/corpus/$corpus"
