#!/usr/bin/env bash
# Builds the container image of packaging/Dockerfile: the static binary first
# (scripts/build-static.sh), then the image, with docker when its daemon answers, else podman.
# An image already tagged for the same binary (label rmq-backup.binary-sha256) is kept, so a
# second run without a change costs only the cargo no-op.
#
# Usage: scripts/build-image.sh
# Environment: RMQ_BACKUP_IMAGE (default rmq-backup:latest), RMQ_BACKUP_ENGINE (docker or
# podman: use this one).
# Prints "<engine> <image>" last. Exits 3, saying why, when no container engine works here.
set -euo pipefail
cd "$(dirname "$0")/.."
image=${RMQ_BACKUP_IMAGE:-rmq-backup:latest}
out="${CARGO_TARGET_DIR:-target}"

engine_works() {
  command -v "$1" >/dev/null 2>&1 && timeout 60 "$1" info >/dev/null 2>&1
}
engine=${RMQ_BACKUP_ENGINE:-}
if [[ -z $engine ]]; then
  for e in docker podman; do
    if engine_works "$e"; then engine=$e; break; fi
  done
fi
if [[ -z $engine ]] || ! engine_works "$engine"; then
  why="no container engine works here:"
  command -v docker >/dev/null 2>&1 && why+=" 'docker info' fails (no daemon);" || why+=" no docker;"
  command -v podman >/dev/null 2>&1 && why+=" 'podman info' fails" || why+=" no podman (apt-get install podman runc)"
  echo "build-image: $why" >&2
  exit 3
fi

bin=$(scripts/build-static.sh | tail -n 1)
sum=$(sha256sum "$bin" | cut -d' ' -f1)
# One image build at a time (tests may call this side by side).
mkdir -p "$out"
exec 8>"$out/.build-image.lock"
flock 8
have=$("$engine" image inspect --format '{{ index .Config.Labels "rmq-backup.binary-sha256" }}' "$image" 2>/dev/null || true)
if [[ $have == "$sum" ]]; then
  echo "build-image: $image already holds this binary (sha256 ${sum:0:12})" >&2
  echo "$engine $image"
  exit 0
fi

ca=${RMQ_BACKUP_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
if [[ ! -s $ca ]]; then
  echo "build-image: $ca is missing (apt-get install ca-certificates, or set RMQ_BACKUP_CA_BUNDLE)" >&2
  exit 1
fi
ctx="$out/image-context"
rm -rf "$ctx"
mkdir -p "$ctx/tmp" "$ctx/data"
chmod 1777 "$ctx/tmp"
chmod 0755 "$ctx/data"
cp "$bin" "$ctx/rmq-backup"
cp "$ca" "$ctx/ca-certificates.crt"
cp packaging/container/passwd packaging/container/group "$ctx/"
version=$("$bin" --version | awk '{print $2}')
"$engine" build -f packaging/Dockerfile -t "$image" \
  --label "rmq-backup.binary-sha256=$sum" \
  --label "org.opencontainers.image.title=rmq-backup" \
  --label "org.opencontainers.image.version=$version" \
  "$ctx" >&2
echo "build-image: built $image with $engine ($(du -h "$bin" | cut -f1) binary, $("$bin" --version))" >&2
echo "$engine $image"
