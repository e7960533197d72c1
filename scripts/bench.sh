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
#        scripts/bench.sh many [queues] [per_queue=4] [body_bytes=512]
#          many small queues beside a raw single-connection client (no count: 5,000 and 20,000
#          queues of 4 x 512 B; `many 20000 0`: empty ones)
#        scripts/bench.sh tls [messages=100000] [body_bytes=1024]
#          backup and restore over TLS against the plain port of the same node (BIN=<binary>)
#        scripts/bench.sh encryption [messages=100000] [body_bytes=1024] [text|random]
#          encrypted (age) against unencrypted backup and restore, alternating (BIN=<binary>)
#
# Environment for the default run and `matrix`: BENCH_AMQP / BENCH_MGMT choose the broker
# (default RabbitMQ 3.10.8, amqp://guest:guest@127.0.0.1:5672 and http://127.0.0.1:15672; the
# suite's 4.3.6 is amqp://guest:guest@127.0.0.1:5692 and http://127.0.0.1:15692);
# BENCH_PROFILE=profiling measures the profiling build (release code with symbols, for
# perf) instead of the release one; BENCH_STORE_CEILING=1/0 forces the store ceiling on or off
# (default: bodies of 16 KiB or more). The reference tool (bench/reference,
# rabbitmq-backup-core 0.2.0) is timed beside the backup when its binary exists
# (bench/reference/target/release/reference-backup; `cargo build --release` there, ~45 min on
# 2 cores); else its CPU line is issue 41's measured figure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-rabbitmq.sh
profile="${BENCH_PROFILE:-release}"
out_dir="target/$profile"
if [[ -x bench/reference/target/release/reference-backup ]]; then
  export BENCH_REFERENCE_BIN="$PWD/bench/reference/target/release/reference-backup"
fi
if [[ "${1:-}" == matrix ]]; then
  # One command for the shapes of the performance issue: each line "messages body_bytes body
  # queue_type compression level queues max_concurrent_queues [protocol]" (protocol amqp091, the
  # default, or amqp10: seeded, read, backed up and restored over AMQP 1.0, BENCH_PROTOCOL;
  # skipped with a printed reason on RabbitMQ before 4.0). Prints one table and writes
  # target/bench-matrix.json. BENCH_ROUNDS (default 3 here) rounds per shape; BENCH_SHAPES=<regex>
  # keeps the matching lines only; BENCH_SEGMENT_VERSIONS="1 2" runs each shape once per segment
  # format version (backup.segment_version), one after the other, each with its own raw
  # references (column v). BENCH_AMQP / BENCH_MGMT: the broker (above).
  cargo build --profile "$profile" --quiet --bin rmq-backup --example bench
  export BENCH_ROUNDS="${BENCH_ROUNDS:-3}"
  out=target/bench-matrix.jsonl
  # BENCH_MATRIX_APPEND=1 keeps the lines of earlier invocations (one table for several
  # brokers or shape sets: run them one after the other, the last prints them all).
  if [[ -z "${BENCH_MATRIX_APPEND:-}" ]]; then
    : > "$out"
  fi
  while read -r n size body qtype comp level queues conc proto; do
    [[ -z "$n" || "$n" == \#* ]] && continue
    proto="${proto:-amqp091}"
    line="$n $size $body $qtype $comp $level $queues $conc $proto"
    [[ -n "${BENCH_SHAPES:-}" && ! "$line" =~ ${BENCH_SHAPES} ]] && continue
    for version in ${BENCH_SEGMENT_VERSIONS:-1}; do
      echo "== $n x $size B $body, $queues $qtype queue(s), max_concurrent_queues $conc, $comp-$level, segment version $version, $proto"
      BENCH_PROTOCOL="$proto" BENCH_QUEUE_TYPE="$qtype" BENCH_COMPRESSION="$comp" BENCH_LEVEL="$level" \
        BENCH_QUEUES="$queues" BENCH_CONCURRENCY="$conc" BENCH_SEGMENT_VERSION="$version" \
        "$out_dir/examples/bench" "$out_dir/rmq-backup" "$n" "$size" "$body" \
        | tee -a /dev/stderr | sed -n 's/^BENCH_JSON //p' >> "$out"
    done
  done <<'SHAPES'
100000 1024 text classic zstd 3 1 4
100000 1024 text classic zstd 3 1 4 amqp10
100000 1024 random classic zstd 3 1 4
100000 1024 text quorum zstd 3 1 4
100000 1024 text quorum zstd 3 1 4 amqp10
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
print(f"{'':<58} {'raw read':>8} {'zstd':>8} {'store':>8} {'':>7} {'backup/':>8} {'backup/':>8} {'backup/':>8} {'backup':>7} {'backup/':>7} {'backup':>6} {'raw pub':>8} {'':>7} {'restore/':>8} {'restore':>7} {'restore':>7} {'validate':>8}")
print(f"{'':<58} {'to whole':>8} {'ceiling':>8} {'ceiling':>8} {'backup':>7} {'raw read':>8} {'zstd':>8} {'store':>8} {'CPU-s':>7} {'ref.':>7} {'RSS':>6} {'confirms':>8} {'restore':>7} {'raw pub':>8} {'CPU-s':>7} {'RSS':>7} {'deep':>8}")
print(f"{'shape':<58} {'msg/s':>8} {'msg/s':>8} {'msg/s':>8} {'msg/s':>7} {'to whole':>8} {'ceiling':>8} {'ceiling':>8} {'/100k':>7} {'CPU':>7} {'MB':>6} {'msg/s':>8} {'msg/s':>7} {'confirms':>8} {'/100k':>7} {'MB':>7} {'MB/s':>8}")
for r in rows:
    comp = r['compression'] + (f"-{r['level']}" if r['compression'] == 'zstd' else '')
    q = r.get('queues', 1)
    qs = f"{q} x {r['messages'] // q}" if q > 1 else f"{r['messages']}"
    shape = f"{r.get('broker', '?')} {'1.0' if r.get('protocol') == 'amqp10' else '091'} v{r.get('segment_version', 1)} {qs} x {r['body_bytes']} B {r['body']}, {r['queue_type']}, {comp}" + (f", mcq {r['max_concurrent_queues']}" if q > 1 else "")
    ceiling = r.get('compression_ceiling_msg_s')
    to_ceiling = r.get('backup_ratio_to_ceiling')
    store = r.get('store_ceiling_msg_s')
    to_store = r.get('backup_ratio_to_store_ceiling')
    ref = r.get('reference_cpu_s_per_100k')
    to_ref = (f"{r['backup_cpu_s_per_100k'] / ref:.2f}" + ('' if r.get('reference_measured') else '*')) if ref else '-'
    print(f"{shape:<58} {r['raw_read_whole_msg_s']:>8.0f} {(f'{ceiling:.0f}' if ceiling else '-'):>8} {(f'{store:.0f}' if store else '-'):>8} {r['backup_msg_s']:>7.0f} {r['backup_ratio']:>8.2f} {(f'{to_ceiling:.2f}' if to_ceiling else '-'):>8} {(f'{to_store:.2f}' if to_store else '-'):>8} {r['backup_cpu_s_per_100k']:>7.2f} {to_ref:>7} {r['backup_peak_rss_kib']/1024:>6.0f} "
          f"{r['raw_publish_msg_s']:>8.0f} {r['restore_msg_s']:>7.0f} {r['restore_ratio']:>8.2f} {r['restore_cpu_s_per_100k']:>7.2f} {r['restore_peak_rss_kib']/1024:>7.0f} {r['validate_deep_mb_s']:>8.0f}")
print("raw read to whole: the raw client reads every message without acks and gives it back, timed until the queue is whole again (a backup's job);")
print("zstd ceiling: zstd at the same level compressing the same records on every core with nothing else running;")
print("backup/raw read to whole, backup/zstd ceiling, restore/raw pub confirms: rmq-backup's msg/s over that reference's (median of per-round ratios);")
print("raw pub confirms: the raw client's publish with confirms (window 1000); raw references time only reading / publishing: messages built and")
print("connections, channels, confirm mode and qos opened before the clock. CPU-s/100k: rmq-backup's user + system seconds per 100,000 messages.")
print("store ceiling: the raw read again, each body written to a file in the storage directory and SHA-256'd, to the queue whole again and")
print("the file synced (bench/store_ceiling.rs: the least a verified backup must do; bodies of 16 KiB or more, BENCH_STORE_CEILING);")
print("backup/ref. CPU: rmq-backup's backup CPU over the reference tool's (rabbitmq-backup-core 0.2.0); * = not built here, issue 41's figure")
print("(4.8 CPU-s per 100,000 x 1 KiB on RabbitMQ 3.10.8) for 1 KiB shapes.")
print("091/1.0: the protocol of the seed, the raw references, the backup's read and the restore (AMQP 0-9-1 or 1.0, BENCH_PROTOCOL;")
print("1.0: backup.amqp10_queues [\"*\"], the raw client the project's own AMQP 1.0 client, the give-back a settled released disposition).")
print("v1/v2/v3: the segment format version written (backup.segment_version; BENCH_SEGMENT_VERSIONS); first column: the broker's version.")
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
  # Many small queues beside a raw single-connection client: [queues] [per queue=4]
  # [body bytes=512]; without a count, the issue's matrix: 5,000 and 20,000 queues of 4 x 512 B;
  # `many 20000 0` measures empty queues. BENCH_AMQP / BENCH_MGMT choose the broker (RabbitMQ
  # 4.3.6 of the suite: amqp://guest:guest@127.0.0.1:5692, http://127.0.0.1:15692),
  # BENCH_COMPARE=<binary> measures another build in the same rounds, BENCH_ROUNDS (3) rounds.
  shift
  cargo build --release --quiet --bin rmq-backup --example many_queues_bench
  if [[ $# -gt 0 ]]; then
    exec target/release/examples/many_queues_bench target/release/rmq-backup "$1" "${2:-4}" "${3:-512}"
  fi
  for queues in 5000 20000; do
    echo "== $queues queues x 4 x 512 B"
    target/release/examples/many_queues_bench target/release/rmq-backup "$queues" 4 512
  done
  exit 0
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
cargo build --profile "$profile" --quiet --bin rmq-backup --example bench --example codec_bench
echo "== record codec (one core)"
"$out_dir/examples/codec_bench"
echo "== backup and restore against a raw client"
for kind in random text; do
  "$out_dir/examples/bench" "$out_dir/rmq-backup" "${1:-100000}" "${2:-1024}" "$kind"
done
