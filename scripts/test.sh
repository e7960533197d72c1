#!/usr/bin/env bash
# The whole test suite: starts the local RabbitMQ and the object-storage emulators (SeaweedFS,
# Azurite, fake-gcs-server) and the two TLS brokers (scripts/setup-rabbitmq-tls.sh) the
# integration tests need, installing them if missing, then runs
# every unit and integration test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-rabbitmq.sh
scripts/setup-storage.sh
scripts/setup-rabbitmq-tls.sh
cargo test --locked "$@"
