#!/usr/bin/env bash
# The whole test suite: starts the local RabbitMQ 3.10.8 and the object-storage emulators
# (SeaweedFS, Azurite, fake-gcs-server), the two TLS brokers (scripts/setup-rabbitmq-tls.sh),
# the three-node test cluster (scripts/setup-rabbitmq-cluster.sh) and RabbitMQ 4.3.6 and
# 4.0.5 in Debian chroots (scripts/setup-rabbitmq-4x.sh) the integration tests need,
# installing them if missing, then runs every unit and integration test against RabbitMQ
# 4.3.6 (RMQ_TEST_BROKER, tests/common), the cross-version set against 4.0.5 and 3.10.8, and
# a short coverage-guided fuzz run of every decoder of untrusted bytes (scripts/fuzz.sh,
# RMQ_BACKUP_FUZZ_SECS seconds per target, default 5; 0 skips it). The fuzz targets and the
# book (scripts/build-docs.sh, mdBook) build beside the tests, which mostly wait on the broker.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-rabbitmq.sh
scripts/setup-storage.sh
scripts/setup-rabbitmq-tls.sh
scripts/setup-rabbitmq-cluster.sh
scripts/setup-rabbitmq-4x.sh
# The main broker of the integration tests; the cross-version set runs again on the others.
export RMQ_TEST_BROKER=${RMQ_TEST_BROKER:-4.3}
cross_version=(delivery_limit backup_restore streams stream_offsets tls)
cross_brokers=(4.0 3.10)
# Tools of the tests: promtool (Debian's prometheus package) for tests/packaging_alerts.rs,
# the Pushgateway (prometheus-pushgateway; tests/metrics_export.rs starts its own on a free
# port, the package's service is not used), a container engine (podman; runc, which runs on
# hosts with hybrid cgroups where crun does not) for tests/container_image.rs, and the age
# tool, with which tests/encryption.rs decrypts a stored segment. --no-install-recommends
# keeps the Prometheus server's extras out (on a host running systemd the package starts its
# own server on :9090; the tests use only promtool).
missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v prometheus-pushgateway >/dev/null 2>&1 || missing+=(prometheus-pushgateway)
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v runc >/dev/null 2>&1 || missing+=(runc)
command -v age >/dev/null 2>&1 || missing+=(age)
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "scripts/test.sh: installing ${missing[*]} (apt-get)" >&2
    sudo=""; [[ $(id -u) -ne 0 ]] && sudo=sudo
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y --no-install-recommends "${missing[@]}" >&2 ||
        { $sudo apt-get update >&2 && $sudo apt-get install -y --no-install-recommends "${missing[@]}" >&2; }
fi
fuzz_secs=${RMQ_BACKUP_FUZZ_SECS:-5}
fuzz_log=$(mktemp)
logs=$(mktemp -d)
trap 'rm -rf "$logs" "$fuzz_log" "${docs_log:-}"' EXIT
if [[ $fuzz_secs -gt 0 ]]; then
    scripts/fuzz.sh build >"$fuzz_log" 2>&1 &
    fuzz_build=$!
fi
# The book (docs/, mdBook): built beside the tests; tests/docs_links.rs checks its links.
docs_log=$(mktemp)
scripts/build-docs.sh >"$docs_log" 2>&1 &
docs_build=$!
# Build every test once, then run three groups at once (most tests wait on a broker, not a
# core): the tests that build and install packages, the tests that stop, kill or alarm nodes
# of the test cluster (one binary at a time), and all the others. Each group's output is
# printed when it ends; the run fails if any group fails.
cargo test --locked --no-run "$@"
slow_builds=(packaging static_binary container_image)
cluster=(cluster faults_broker faults_restore)
rest=()
for f in tests/*.rs; do
    t=$(basename "$f" .rs)
    [[ " ${slow_builds[*]} ${cluster[*]} " == *" $t "* ]] || rest+=("$t")
done
as_args() { local t; for t; do printf -- '--test\n%s\n' "$t"; done; }
run_group() {
    local name=$1
    shift
    if cargo test --locked "$@" >"$logs/$name" 2>&1; then
        echo ok >"$logs/$name.rc"
    fi
}
mapfile -t slow_args < <(as_args "${slow_builds[@]}")
mapfile -t cluster_args < <(as_args "${cluster[@]}")
mapfile -t rest_args < <(as_args "${rest[@]}")
run_group packaging "$@" "${slow_args[@]}" &
groups=($!)
run_group cluster "$@" "${cluster_args[@]}" &
groups+=($!)
run_group rest "$@" --lib --bins "${rest_args[@]}" &
groups+=($!)
run_group doc "$@" --doc &
groups+=($!)
mapfile -t cross_args < <(as_args "${cross_version[@]}")
(
    for b in "${cross_brokers[@]}"; do
        RMQ_TEST_BROKER=$b run_group "cross-$b" "$@" "${cross_args[@]}"
    done
) &
groups+=($!)
wait "${groups[@]}"
failed=0
for g in rest cluster packaging doc "${cross_brokers[@]/#/cross-}"; do
    echo "=== test group: $g ==="
    cat "$logs/$g"
    [[ -f "$logs/$g.rc" ]] || failed=1
done
echo "=== the book (scripts/build-docs.sh) ==="
cat "$docs_log"
wait "$docs_build" || failed=1
if [[ $failed -ne 0 ]]; then
    echo "scripts/test.sh: a test group or the book failed (see above)" >&2
    exit 1
fi
if [[ $fuzz_secs -gt 0 ]]; then
    if ! wait "$fuzz_build"; then
        cat "$fuzz_log" >&2
        exit 1
    fi
    scripts/fuzz.sh "$fuzz_secs"
fi
