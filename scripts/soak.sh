#!/usr/bin/env bash
# The soak (issue "Faults"; not part of scripts/test.sh): backups and restores of the
# three-node test cluster for SOAK_SECS seconds (default 1800) under live publish and consume
# load, a fault injected at a random moment of each backup (a connection closed, a node's
# application stopped, a node killed, a memory alarm, the backup SIGKILLed), then every
# invariant checked; prints a report (tests/soak.rs says what is checked).
#
#   scripts/soak.sh                 30 minutes
#   SOAK_SECS=300 scripts/soak.sh   5 minutes
#   SOAK_SEED=<n> scripts/soak.sh   the same sequence of faults as an earlier run
#
# It stops and kills nodes of the test cluster: do not run it beside the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-rabbitmq.sh
scripts/setup-rabbitmq-cluster.sh
# A debug build: what is under test is behaviour under faults, not speed (SOAK_RELEASE=1
# builds release).
exec cargo test ${SOAK_RELEASE:+--release} --locked --test soak -- --ignored --nocapture --test-threads 1
