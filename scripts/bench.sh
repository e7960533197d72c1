#!/usr/bin/env bash
# Throughput and memory benchmark: rmq-backup beside a raw client on the same local broker, in
# one run, plus the record codec benchmark. Release build.
#
# Usage: scripts/bench.sh [messages=100000] [body_bytes=1024]   (random and JSON-like bodies)
#        scripts/bench.sh matrix    (every shape below, one table, target/bench-matrix.json)
#        scripts/bench.sh pipeline  (the backup pipeline without a broker, 0/1/2 zstd workers)
#        scripts/bench.sh stream [messages] [body_bytes] [text|random]
#          stream backup over the stream protocol beside a raw stream-protocol read
#        scripts/bench.sh storage [messages=100000] [body_bytes=1024]
#          backup throughput to filesystem, S3, Azure Blob and GCS (the local emulators)
#        scripts/bench.sh cluster [per_queue=10000] [body_bytes=1024]
#          the test cluster: node-local vs not, 3 shard workers vs 1, bytes between nodes
#        scripts/bench.sh many [queues=5000] [per_queue=4] [body_bytes=512]
#          many small queues beside a raw single-connection client (`many 20000 0`: empty ones)
#        scripts/bench.sh tls [messages=100000] [body_bytes=1024]
#          backup and restore over TLS against the plain port of the same node (BIN=<binary>)
#        scripts/bench.sh encryption [messages=100000] [body_bytes=1024] [text|random]
#          encrypted (age) against unencrypted backup and restore, alternating (BIN=<binary>)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-rabbitmq.sh
if [[ "${1:-}" == matrix ]]; then
  # One command for the shapes of the performance issue: each line "messages body_bytes body
  # queue_type compression level queues max_concurrent_queues". Prints one table and writes
  # target/bench-matrix.json. BENCH_ROUNDS (default 3 here) rounds per shape; BENCH_SHAPES=<regex>
  # keeps the matching lines only; BENCH_SEGMENT_VERSIONS="1 2" runs each shape once per segment
  # format version (backup.segment_version), one after the other, each with its own raw
  # references (column v).
  cargo build --release --quiet --bin rmq-backup --example bench
  export BENCH_ROUNDS="${BENCH_ROUNDS:-3}"
  out=target/bench-matrix.jsonl
  : > "$out"
  while read -r n size body qtype comp level queues conc; do
    [[ -z "$n" || "$n" == \#* ]] && continue
    line="$n $size $body $qtype $comp $level $queues $conc"
    [[ -n "${BENCH_SHAPES:-}" && ! "$line" =~ ${BENCH_SHAPES} ]] && continue
    for version in ${BENCH_SEGMENT_VERSIONS:-1}; do
      echo "== $n x $size B $body, $queues $qtype queue(s), max_concurrent_queues $conc, $comp-$level, segment version $version"
      BENCH_QUEUE_TYPE="$qtype" BENCH_COMPRESSION="$comp" BENCH_LEVEL="$level" \
        BENCH_QUEUES="$queues" BENCH_CONCURRENCY="$conc" BENCH_SEGMENT_VERSION="$version" \
        target/release/examples/bench target/release/rmq-backup "$n" "$size" "$body" \
        | tee -a /dev/stderr | sed -n 's/^BENCH_JSON //p' >> "$out"
    done
  done <<'SHAPES'
100000 1024 text classic zstd 3 1 4
100000 1024 random classic zstd 3 1 4
100000 1024 text quorum zstd 3 1 4
100000 1024 text classic lz4 3 1 4
100000 1024 text classic none 3 1 4
200000 1024 text classic zstd 3 8 4
200000 1024 text classic zstd 3 8 8
5000 65536 text classic zstd 3 1 4
5000 65536 random classic zstd 3 1 4
5000 65536 random classic zstd 1 1 4
5000 65536 random classic lz4 3 1 4
5000 65536 random classic none 3 1 4
300 1048576 random classic zstd 3 1 4
1000000 1024 text classic zstd 3 1 4
SHAPES
  python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
json.dump(rows, open("target/bench-matrix.json", "w"), indent=1)
print()
# Every ratio is rmq-backup's msg/s over its reference's msg/s (medians of the per-round ratios).
print(f"{'':<46} {'raw read':>8} {'zstd':>8} {'':>7} {'backup/':>8} {'backup/':>8} {'backup':>7} {'backup':>6} {'raw pub':>8} {'':>7} {'restore/':>8} {'restore':>7} {'restore':>7} {'validate':>8}")
print(f"{'':<46} {'to whole':>8} {'ceiling':>8} {'backup':>7} {'raw read':>8} {'zstd':>8} {'CPU-s':>7} {'RSS':>6} {'confirms':>8} {'restore':>7} {'raw pub':>8} {'CPU-s':>7} {'RSS':>7} {'deep':>8}")
print(f"{'shape':<46} {'msg/s':>8} {'msg/s':>8} {'msg/s':>7} {'to whole':>8} {'ceiling':>8} {'/100k':>7} {'MB':>6} {'msg/s':>8} {'msg/s':>7} {'confirms':>8} {'/100k':>7} {'MB':>7} {'MB/s':>8}")
for r in rows:
    comp = r['compression'] + (f"-{r['level']}" if r['compression'] == 'zstd' else '')
    q = r.get('queues', 1)
    qs = f"{q} x {r['messages'] // q}" if q > 1 else f"{r['messages']}"
    shape = f"v{r.get('segment_version', 1)} {qs} x {r['body_bytes']} B {r['body']}, {r['queue_type']}, {comp}" + (f", mcq {r['max_concurrent_queues']}" if q > 1 else "")
    ceiling = r.get('compression_ceiling_msg_s')
    to_ceiling = r.get('backup_ratio_to_ceiling')
    print(f"{shape:<46} {r['raw_read_whole_msg_s']:>8.0f} {(f'{ceiling:.0f}' if ceiling else '-'):>8} {r['backup_msg_s']:>7.0f} {r['backup_ratio']:>8.2f} {(f'{to_ceiling:.2f}' if to_ceiling else '-'):>8} {r['backup_cpu_s_per_100k']:>7.2f} {r['backup_peak_rss_kib']/1024:>6.0f} "
          f"{r['raw_publish_msg_s']:>8.0f} {r['restore_msg_s']:>7.0f} {r['restore_ratio']:>8.2f} {r['restore_cpu_s_per_100k']:>7.2f} {r['restore_peak_rss_kib']/1024:>7.0f} {r['validate_deep_mb_s']:>8.0f}")
print("raw read to whole: the raw client reads every message without acks and gives it back, timed until the queue is whole again (a backup's job);")
print("zstd ceiling: zstd at the same level compressing the same records on every core with nothing else running;")
print("backup/raw read to whole, backup/zstd ceiling, restore/raw pub confirms: rmq-backup's msg/s over that reference's (median of per-round ratios);")
print("raw pub confirms: the raw client's publish with confirms (window 1000); raw references time only reading / publishing: messages built and")
print("connections, channels, confirm mode and qos opened before the clock. CPU-s/100k: rmq-backup's user + system seconds per 100,000 messages.")
print("v1/v2: the segment format version written (backup.segment_version; BENCH_SEGMENT_VERSIONS).")
print("(written to target/bench-matrix.json)")
PY
  exit 0
fi
if [[ "${1:-}" == stream ]]; then
  shift
  cargo build --release --quiet --bin rmq-backup --example stream_bench
  exec target/release/examples/stream_bench target/release/rmq-backup "${1:-100000}" "${2:-1024}" "${3:-text}"
fi
if [[ "${1:-}" == tls ]]; then
  # TLS against plain on the same node (scripts/setup-rabbitmq-tls.sh); BIN=<binary> measures
  # another build (e.g. the static one from scripts/build-static.sh).
  shift
  scripts/setup-rabbitmq-tls.sh
  cargo build --release --quiet --bin rmq-backup --example tls_bench
  exec target/release/examples/tls_bench "${BIN:-target/release/rmq-backup}" "${1:-100000}" "${2:-1024}"
fi
if [[ "${1:-}" == encryption ]]; then
  # Encryption at rest against none, same queue, same run (BENCH_ROUNDS, default 3).
  shift
  cargo build --release --quiet --bin rmq-backup --example encryption_bench
  exec target/release/examples/encryption_bench "${BIN:-target/release/rmq-backup}" "${1:-100000}" "${2:-1024}" "${3:-text}"
fi
if [[ "${1:-}" == many ]]; then
  # Many small queues beside a raw single-connection client: [queues=5000] [per queue=4]
  # [body bytes=512]; `many 20000 0` measures empty queues.
  shift
  cargo build --release --quiet --bin rmq-backup --example many_queues_bench
  exec target/release/examples/many_queues_bench target/release/rmq-backup "${1:-5000}" "${2:-4}" "${3:-512}"
fi
if [[ "${1:-}" == cluster ]]; then
  # The three-node test cluster: raw references (each queue through its node, or all through
  # one), rmq-backup node-local or not, and three shard workers: [per queue=10000] [bytes=1024].
  shift
  scripts/setup-rabbitmq-cluster.sh
  cargo build --release --quiet --bin rmq-backup --example cluster_bench
  exec target/release/examples/cluster_bench target/release/rmq-backup "${1:-10000}" "${2:-1024}"
fi
if [[ "${1:-}" == pipeline ]]; then
  cargo build --release --quiet --example pipeline_bench
  exec target/release/examples/pipeline_bench
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
