#!/usr/bin/env bash
# Builds specd's container images with Debian's Docker engine, on a Debian 12 machine that may
# have no engine running and no image registry to pull from.
#
#   bash scripts/containers.sh                          full multi-stage CPU build -> specd:cpu
#   bash scripts/containers.sh --runtime-only build     pack the host build in build/ instead
#   bash scripts/containers.sh ... --tag NAME:TAG       another tag
#   bash scripts/containers.sh ... -- COMMAND [ARG...]  then run COMMAND with the engine up
#
# Each step is skipped when already done, so it is safe to re-run:
#   1. install docker.io, docker-compose and debootstrap (Debian packages);
#   2. start dockerd if no engine answers; at exit, stop it again (only a dockerd started here);
#   3. make the debian:12 base image by debootstrap when it is missing, and tag it debian:12-slim
#      too (deploy/Dockerfile's CPU build uses both);
#   4. build the specd image, and specd-prometheus (Debian's Prometheus) for docker-compose.yml.
# It runs as root (re-running itself under sudo when it can). Runs on one machine take turns.
# Exit status 77: no container engine can run here; the reason is printed.
#   SPECD_DEBIAN_MIRROR  mirror for debootstrap and the image's apt (default: deb.debian.org)
set -euo pipefail
cd "$(dirname "$0")/.."
readonly NO_ENGINE=77

log() { printf '[containers %3ds] %s\n' "$SECONDS" "$*" >&2; }
no_engine() {
  log "no container engine can run here: $*"
  exit "$NO_ENGINE"
}

runtime_only="" tag="specd:cpu" command=()
while (($#)); do
  case "$1" in
    --runtime-only) runtime_only=${2:?--runtime-only needs the host build directory}; shift 2 ;;
    --tag) tag=${2:?--tag needs NAME:TAG}; shift 2 ;;
    --) shift; command=("$@"); break ;;
    *) echo "usage: $0 [--runtime-only BUILD_DIR] [--tag NAME:TAG] [-- COMMAND...]" >&2; exit 2 ;;
  esac
done

if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null && { [[ -t 0 ]] || sudo -n true 2>/dev/null; }; then
    exec sudo --preserve-env bash "$0" "$@"
  fi
  no_engine "installing and starting dockerd needs root, and sudo is not available"
fi

# /usr/bin/docker is Debian's client, with BuildKit built in; another `docker` earlier in PATH
# may need a buildx plugin that Debian 12 does not package.
readonly DOCKER=/usr/bin/docker
readonly STATE_DIR=/run/specd-containers
readonly MIRROR="${SPECD_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
mkdir -p "$STATE_DIR"

# Runs on one machine (say, two test suites) take turns: one of them may stop the engine the
# other is using, and they build the same tags.
exec {lock_fd}>"$STATE_DIR/lock"
if ! flock -n "$lock_fd"; then
  log "waiting for another scripts/containers.sh on this machine to finish"
  flock -w 900 "$lock_fd" || { log "gave up waiting after 900 s"; exit 1; }
fi

cleanups=()
started_dockerd=""
on_exit() {
  local status=$?
  for ((i = ${#cleanups[@]} - 1; i >= 0; i--)); do eval "${cleanups[i]}" || true; done
  stop_dockerd
  exit "$status"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

install_packages() {
  local missing=()
  for p in docker.io docker-compose debootstrap; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
      || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  log "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

engine_answers() { timeout 20 "$DOCKER" info >/dev/null 2>&1; }

# The dockerd this script started, by pid; a run that was killed before it could stop its own
# leaves the pid here, and the next run stops that one too.
readonly DOCKERD_PID_FILE="$STATE_DIR/dockerd.pid"
is_our_dockerd() { [[ -n "$1" && "$(cat "/proc/$1/comm" 2>/dev/null)" == dockerd ]]; }

start_dockerd() {
  local previous
  previous=$(cat "$DOCKERD_PID_FILE" 2>/dev/null || true)
  if engine_answers; then
    if is_our_dockerd "$previous"; then
      started_dockerd=$previous
      log "using dockerd (pid $previous) left by an earlier run; it is stopped at exit"
    else
      log "using the Docker engine already running"
    fi
    return
  fi
  log "starting dockerd"
  local dockerd_log="$STATE_DIR/dockerd.log"
  # Its own session, so that a Ctrl-C meant for this script reaches it only as the stop below;
  # without the lock, which it would otherwise hold for as long as it runs.
  setsid dockerd >"$dockerd_log" 2>&1 </dev/null {lock_fd}>&- &
  started_dockerd=$!
  echo "$started_dockerd" >"$DOCKERD_PID_FILE"
  for _ in $(seq 1 60); do
    engine_answers && { log "dockerd is up (pid $started_dockerd)"; return; }
    kill -0 "$started_dockerd" 2>/dev/null || break
    sleep 1
  done
  tail -n 20 "$dockerd_log" >&2 || true
  stop_dockerd
  no_engine "dockerd did not start (its log: $dockerd_log)"
}

stop_dockerd() {
  [[ -n "$started_dockerd" ]] || return 0
  local pid=$started_dockerd
  started_dockerd=""
  is_our_dockerd "$pid" || { rm -f "$DOCKERD_PID_FILE"; return 0; }
  log "stopping the dockerd started here (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$DOCKERD_PID_FILE"; return 0; }
    sleep 0.5
  done
  log "dockerd did not stop in 30 s; killing it"
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$DOCKERD_PID_FILE"
}

# Unmounts what debootstrap (or the tmpfs above) left mounted in `dir`, then removes it,
# never crossing into a mount.
remove_work_dir() {
  local dir=$1
  [[ -d "$dir" ]] || return 0
  findmnt -rn -o TARGET | grep -F "$dir/" | sort -r | xargs -r -n1 umount -l || true
  mountpoint -q "$dir" && umount -l "$dir"
  rm -rf --one-file-system "$dir"
}

image_exists() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

# What the official slim images leave out, so that images built on this one stay small too.
write_slim_config() {
  local root=$1
  cat >"$root/etc/dpkg/dpkg.cfg.d/docker-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
EOF
  cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  cat >"$root/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
  find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/lintian/*
  find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin \
    "$root"/var/lib/apt/lists/*
}

make_base_image() {
  if ! image_exists debian:12; then
    log "making the debian:12 image by debootstrap (about 2 minutes)"
    # A fixed place (runs take turns), so that one killed midway is cleaned up by the next.
    local work=/var/tmp/specd-containers-rootfs
    remove_work_dir "$work"
    mkdir -m 0755 "$work"
    cleanups+=("remove_work_dir '$work'")
    # On tmpfs dpkg's many fsyncs cost nothing: a minute less on a slow disk.
    mount -t tmpfs -o size=2g,mode=0755 tmpfs "$work" 2>/dev/null || true
    if ! debootstrap --variant=minbase bookworm "$work/rootfs" "$MIRROR" >"$work/log" 2>&1; then
      tail -n 20 "$work/log" >&2
      log "debootstrap failed"
      exit 1
    fi
    write_slim_config "$work/rootfs"
    tar -C "$work/rootfs" -c . | "$DOCKER" import -c 'CMD ["bash"]' - debian:12 >/dev/null
    remove_work_dir "$work"
    log "made debian:12 ($("$DOCKER" image inspect -f '{{.Size}}' debian:12 | numfmt --to=si)B)"
  fi
  if ! image_exists debian:12-slim; then
    "$DOCKER" tag debian:12 debian:12-slim
    log "tagged debian:12 as debian:12-slim"
  fi
}

# Builds with BuildKit, and removes the image that `name` pointed to before, if the build moved
# it, so that repeated builds leave no untagged images behind.
build_image() {
  local name=$1
  shift
  local before after
  before=$("$DOCKER" image inspect -f '{{.Id}}' "$name" 2>/dev/null || true)
  DOCKER_BUILDKIT=1 "$DOCKER" build --progress=plain -t "$name" "$@" >"$STATE_DIR/build.log" 2>&1 \
    || { tail -n 40 "$STATE_DIR/build.log" >&2; log "building $name failed"; exit 1; }
  after=$("$DOCKER" image inspect -f '{{.Id}}' "$name")
  if [[ -n "$before" && "$before" != "$after" ]]; then
    "$DOCKER" rmi "$before" >/dev/null 2>&1 || true
  fi
  log "built $name ($("$DOCKER" image inspect -f '{{.Size}}' "$name" | numfmt --to=si)B)"
}

build_images() {
  if [[ -n "$runtime_only" ]]; then
    local context=/var/tmp/specd-containers-context
    cleanups+=("rm -rf '$context'")
    bash deploy/stage-binaries.sh "$runtime_only" "$context"
    log "building $tag from the host build in $runtime_only"
    build_image "$tag" -f deploy/Dockerfile --build-arg BINARIES=prebuilt \
      --build-arg RUNTIME_IMAGE=debian:12-slim "$context"
  else
    log "building $tag: compiling specd inside the image (long on few cores)"
    build_image "$tag" -f deploy/Dockerfile --build-arg BUILDER_IMAGE=debian:12 \
      --build-arg RUNTIME_IMAGE=debian:12-slim .
  fi
  log "building specd-prometheus"
  build_image specd-prometheus:latest deploy/prometheus
}

install_packages
start_dockerd
make_base_image
build_images
if ((${#command[@]})); then
  log "running: ${command[*]}"
  set +e
  "${command[@]}" {lock_fd}>&-
  status=$?
  set -e
  log "done (exit status $status)"
  exit "$status"
fi
