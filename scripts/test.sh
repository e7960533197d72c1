#!/usr/bin/env bash
# The whole test suite: starts the local RabbitMQ the integration tests need (installing it if
# missing), then runs every unit and integration test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-rabbitmq.sh
cargo test --locked "$@"
