#!/usr/bin/env bash
# Stages what the runtime image holds: the four specd binaries, stripped, and every shared library
# they load except the C library's own, which the runtime base image provides. The Dockerfile's
# builder stage runs it on its own build; scripts/containers.sh runs it on a host build, so both
# image paths pack the same set of files the same way.
#
#   usage: deploy/stage-binaries.sh BUILD_DIR OUT_DIR     (writes OUT_DIR/bin and OUT_DIR/lib)
set -euo pipefail
if (($# != 2)); then
  echo "usage: $0 BUILD_DIR OUT_DIR" >&2
  exit 2
fi
build=$1
out=$2
binaries=(
  "$build/tools/specd"
  "$build/services/coordinator/specd-coordinator"
  "$build/services/draft_worker/specd-draft-worker"
  "$build/services/target_worker/specd-target-worker"
)
for b in "${binaries[@]}"; do
  [[ -x "$b" ]] || { echo "$0: $b is missing; build it first" >&2; exit 1; }
done

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for b in "${binaries[@]}"; do
  # Debug info is most of a RelWithDebInfo binary's size and no use in a container.
  strip --strip-unneeded -o "$out/bin/$(basename "$b")" "$b"
done
# `ldd` prints "name => /path (address)" for each library it resolved and "not found" otherwise.
# Left out: the C library (the base image has its own), the CUDA toolkit's libraries (the CUDA
# runtime image has them) and the GPU driver's (the NVIDIA container runtime mounts the host's;
# a CUDA build links the driver library's stub, which ldd cannot resolve).
driver='lib(cuda|nvidia-[a-z-]+)\.so'
missing=$(ldd "${binaries[@]}" | grep "not found" | grep -v -E "$driver" || true)
[[ -z "$missing" ]] || { echo "$0: unresolved libraries:" >&2; echo "$missing" >&2; exit 1; }
ldd "${binaries[@]}" | awk '/=> \// {print $3}' | sort -u \
  | grep -v -E '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux[^/]*)\.so' \
  | grep -v -E "^/usr/local/cuda|/$driver" \
  | while read -r lib; do cp -L "$lib" "$out/lib/"; done
staged_bins=("$out"/bin/*) staged_libs=("$out"/lib/*)
echo "staged ${#staged_bins[@]} binaries and ${#staged_libs[@]} libraries in $out" >&2
