#!/usr/bin/env bash
# The whole test suite: starts the local RabbitMQ and the object-storage emulators (SeaweedFS,
# Azurite, fake-gcs-server), the two TLS brokers (scripts/setup-rabbitmq-tls.sh) and the
# three-node test cluster (scripts/setup-rabbitmq-cluster.sh) the integration tests need,
# installing them if missing, then runs
# every unit and integration test, and a short coverage-guided fuzz run of every decoder of
# untrusted bytes (scripts/fuzz.sh, RMQ_BACKUP_FUZZ_SECS seconds per target, default 5; 0
# skips it). The fuzz targets build beside the tests, which mostly wait on the broker.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-rabbitmq.sh
scripts/setup-storage.sh
scripts/setup-rabbitmq-tls.sh
scripts/setup-rabbitmq-cluster.sh
fuzz_secs=${RMQ_BACKUP_FUZZ_SECS:-5}
fuzz_log=$(mktemp)
trap 'rm -f "$fuzz_log"' EXIT
if [[ $fuzz_secs -gt 0 ]]; then
    scripts/fuzz.sh build >"$fuzz_log" 2>&1 &
    fuzz_build=$!
fi
cargo test --locked "$@"
if [[ $fuzz_secs -gt 0 ]]; then
    if ! wait "$fuzz_build"; then
        cat "$fuzz_log" >&2
        exit 1
    fi
    scripts/fuzz.sh "$fuzz_secs"
fi
