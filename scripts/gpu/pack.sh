#!/usr/bin/env bash
# Run HERE (nvcc 13 and the Debian packages of scripts/setup.sh installed, no GPU needed) before a
# device session: builds the engine-only CUDA binaries that scripts/gpu/device_check.sh runs
# (Release, sm_90) into build-gpu/, and the service binaries (specd, the coordinator and both
# workers) in the full build (build/, which must have the CUDA back end ON, as setup.sh makes it
# wherever nvcc is found), and packs them into .gpu-pack/ (git-ignored) with the shared libraries
# they need that a bare GPU machine lacks (gRPC, Protobuf, Abseil, prometheus-cpp, OpenSSL, ...).
# Carry .gpu-pack: device_check.sh then builds nothing on the device. Every device call starts on
# a bare machine, and a build there costs minutes of the session's device time.
#   SPECD_GPU_PACK_BUILD  the engine-only build tree (default build-gpu)
#   SPECD_BUILD_DIR       the full build tree the services come from (default build)
#
# The C library, libstdc++, the CUDA driver and the CUDA toolkit's libraries (cuBLAS, the runtime)
# are not packed: the GPU machine's own are newer or must match its driver.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/binaries.sh
BUILD=${SPECD_GPU_PACK_BUILD:-build-gpu}
FULL_BUILD=${SPECD_BUILD_DIR:-build}
PACK=.gpu-pack

mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSPECD_ENGINE_ONLY=ON \
      -DSPECD_CUDA_ARCHITECTURES=90-real >"$BUILD/configure.log" 2>&1 ||
  { cat "$BUILD/configure.log" >&2; exit 1; }
grep -q "CUDA back end ON" "$BUILD/configure.log" ||
  { echo "pack: no CUDA toolkit found; nothing to pack" >&2; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" --target "${GPU_TARGETS[@]}"
# The services: the full build's own configuration (RelWithDebInfo; stripped below).
[[ -f $FULL_BUILD/CMakeCache.txt ]] ||
  { echo "pack: no full build in $FULL_BUILD (run scripts/setup.sh first)" >&2; exit 1; }
grep -q "^SPECD_CUDA:BOOL=ON" "$FULL_BUILD/CMakeCache.txt" && [[ -d $FULL_BUILD/kernels/cuda ]] ||
  { echo "pack: $FULL_BUILD has no CUDA back end; its services could not use the GPU" >&2; exit 1; }
cmake --build "$FULL_BUILD" -j"$(nproc)" --target "${GPU_SERVICE_TARGETS[@]}"

# Assembled in a folder, then carried as one xz archive (about 10 MB for 60 MB of binaries and
# libraries), which keeps the carry well under its limit.
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/lib"
declare -A packed=()
for b in "${GPU_BINARIES[@]}" "${GPU_SERVICE_BINARIES[@]}"; do
  src=$BUILD/$b
  [[ -f $src ]] || src=$FULL_BUILD/$b
  mkdir -p "$STAGE/build/$(dirname "$b")"
  strip -o "$STAGE/build/$b" "$src"
  while read -r lib; do
    case "${lib##*/}" in
      libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libstdc++.so* | \
      libgcc_s.so* | libcuda.so* | libcublas* | libcudart* | libnvidia*) continue ;;
    esac
    [[ -n "${packed[$lib]:-}" ]] && continue
    packed[$lib]=1
    cp -L "$lib" "$STAGE/lib/"
  done < <(ldd "$src" | awk '$2 == "=>" && $3 ~ /^\// {print $3}')
done
rm -rf "$PACK"
mkdir -p "$PACK"
tar -cJf "$PACK/pack.tar.xz" -C "$STAGE" build lib
# So the device can tell a pack from another commit.
git rev-parse HEAD >"$PACK/commit"
git diff --quiet HEAD -- . ':!.gpu-pack' || echo "with uncommitted changes" >>"$PACK/commit"
echo "pack: $(du -sh "$STAGE" | cut -f1) ($(ls "$STAGE/lib" | wc -l) libraries) as" \
     "$(du -h "$PACK/pack.tar.xz" | cut -f1) in $PACK/pack.tar.xz" >&2
