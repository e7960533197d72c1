#!/usr/bin/env bash
# Builds rmq-backup as a fully static x86_64 Linux binary: the musl target, with musl-gcc for
# the C parts (zstd, lz4, ring, SQLite). Installs the target and musl-tools when missing.
# Prints the binary's path last.
#
# Usage: scripts/build-static.sh
# Environment: RMQ_BACKUP_STATIC_PROFILE, the cargo profile (default `release`, what is shipped:
# fat LTO, one codegen unit). scripts/test.sh sets `static-check` (Cargo.toml: the tests' settings, no
# debug info): the tests of the static binary and its packages check what static linking, the
# musl target and the packaging do, which optimisation does not change, and that build takes a
# fraction of the release build's CPU on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-unknown-linux-musl
profile=${RMQ_BACKUP_STATIC_PROFILE:-release}
out="${CARGO_TARGET_DIR:-target}"
# One build at a time (tests and scripts may call this side by side).
mkdir -p "$out"
exec 9>"$out/.build-static.lock"
flock 9
if ! rustup target list --installed | grep -qx "$target"; then
  echo "build-static: adding the Rust target $target" >&2
  rustup target add "$target" >&2
fi
if ! command -v musl-gcc >/dev/null; then
  echo "build-static: installing musl-tools (musl-gcc)" >&2
  sudo=""; [[ $(id -u) -ne 0 ]] && sudo=sudo
  $sudo apt-get install -y musl-tools >&2 || { $sudo apt-get update >&2 && $sudo apt-get install -y musl-tools >&2; }
fi
CC_x86_64_unknown_linux_musl=musl-gcc \
  cargo build --profile "$profile" --locked --target "$target" --bin rmq-backup >&2
bin="$out/$target/$profile/rmq-backup"
if ldd "$bin" 2>&1 | grep -qv 'not a dynamic executable\|statically linked'; then
  echo "build-static: $bin is not static:" >&2
  ldd "$bin" >&2
  exit 1
fi
echo "build-static: $(du -h "$bin" | cut -f1) $("$bin" --version)" >&2
echo "$bin"
