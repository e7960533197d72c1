#!/usr/bin/env bash
# Throughput and memory benchmark: rmq-backup beside a raw client on the same local broker, in
# one run, plus the record codec benchmark. Release build.
#
# Usage: scripts/bench.sh [messages=100000] [body_bytes=1024]   (random and JSON-like bodies)
#        scripts/bench.sh storage [messages=100000] [body_bytes=1024]
#          backup throughput to filesystem, S3, Azure Blob and GCS (the local emulators)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-rabbitmq.sh
if [[ "${1:-}" == storage ]]; then
  shift
  scripts/setup-storage.sh
  cargo build --release --quiet --bin rmq-backup --example storage_bench
  exec target/release/examples/storage_bench target/release/rmq-backup "${1:-100000}" "${2:-1024}" text
fi
cargo build --release --quiet --bin rmq-backup --example bench --example codec_bench
echo "== record codec (one core)"
target/release/examples/codec_bench
echo "== backup and restore against a raw client"
for kind in random text; do
  target/release/examples/bench target/release/rmq-backup "${1:-100000}" "${2:-1024}" "$kind"
done
