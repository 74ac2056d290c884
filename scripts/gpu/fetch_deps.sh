#!/usr/bin/env bash
# Run HERE (a Debian 12 machine that reaches Debian's package registry), before handing the tree
# to a GPU machine: downloads the C++ libraries the engine-only build needs and a bare GPU machine
# lacks (Abseil, nlohmann-json, GoogleTest, PCRE2, OpenSSL) as .deb files into .gpu-deps/ (git-ignored).
# scripts/gpu/device_check.sh unpacks them under a prefix there; carry .gpu-deps with the tree.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu-deps
cd .gpu-deps
PACKAGES=(libabsl-dev libabsl20220623 nlohmann-json3-dev libgtest-dev libgmock-dev libpcre2-dev
          libpcre2-8-0 libssl-dev libssl3)
if ! apt-get download "${PACKAGES[@]}" >/dev/null 2>&1; then
  apt-get update -qq
  apt-get download "${PACKAGES[@]}"
fi
ls -la
du -sh .
