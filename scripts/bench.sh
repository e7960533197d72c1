#!/usr/bin/env bash
# Throughput and memory benchmark: rmq-backup beside a raw client on the same local broker, in
# one run, plus the record codec benchmark. Release build.
#
# Usage: scripts/bench.sh [messages=100000] [body_bytes=1024]   (random and JSON-like bodies)
#        scripts/bench.sh matrix    (every shape below, one table, target/bench-matrix.json)
#        scripts/bench.sh storage [messages=100000] [body_bytes=1024]
#          backup throughput to filesystem, S3, Azure Blob and GCS (the local emulators)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-rabbitmq.sh
if [[ "${1:-}" == matrix ]]; then
  # One command for the shapes of the performance issue that the bench measures today: each
  # line "messages body_bytes body queue_type compression". Prints one table and writes
  # target/bench-matrix.json. BENCH_ROUNDS (default 3 here) rounds per shape.
  cargo build --release --quiet --bin rmq-backup --example bench
  export BENCH_ROUNDS="${BENCH_ROUNDS:-3}"
  out=target/bench-matrix.jsonl
  : > "$out"
  while read -r n size body qtype comp; do
    [[ -z "$n" || "$n" == \#* ]] && continue
    echo "== $n x $size B $body, $qtype, $comp"
    BENCH_QUEUE_TYPE="$qtype" BENCH_COMPRESSION="$comp" \
      target/release/examples/bench target/release/rmq-backup "$n" "$size" "$body" \
      | tee /dev/stderr | sed -n 's/^BENCH_JSON //p' >> "$out"
  done <<'SHAPES'
100000 1024 text classic zstd
100000 1024 random classic zstd
100000 1024 text quorum zstd
100000 1024 text classic lz4
100000 1024 text classic none
5000 65536 text classic zstd
5000 65536 random classic zstd
5000 65536 random classic lz4
5000 65536 random classic none
300 1048576 random classic zstd
1000000 1024 text classic zstd
SHAPES
  python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
json.dump(rows, open("target/bench-matrix.json", "w"), indent=1)
print()
print(f"{'shape':<40} {'backup msg/s':>12} {'vs raw':>7} {'CPU-s/100k':>10} {'RSS MB':>7} {'restore msg/s':>13} {'vs raw':>7} {'CPU-s/100k':>10} {'RSS MB':>7}")
for r in rows:
    shape = f"{r['messages']} x {r['body_bytes']} B {r['body']}, {r['queue_type']}, {r['compression']}"
    print(f"{shape:<40} {r['backup_msg_s']:>12.0f} {r['backup_ratio']:>7.2f} {r['backup_cpu_s_per_100k']:>10.2f} {r['backup_peak_rss_kib']/1024:>7.0f} "
          f"{r['restore_msg_s']:>13.0f} {r['restore_ratio']:>7.2f} {r['restore_cpu_s_per_100k']:>10.2f} {r['restore_peak_rss_kib']/1024:>7.0f}")
print("(written to target/bench-matrix.json)")
PY
  exit 0
fi
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
