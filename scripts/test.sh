#!/usr/bin/env bash
# The whole test suite: starts the local RabbitMQ 3.10.8 and the object-storage emulators
# (SeaweedFS, Azurite, fake-gcs-server), the two TLS brokers (scripts/setup-rabbitmq-tls.sh),
# the three-node test cluster (scripts/setup-rabbitmq-cluster.sh) and RabbitMQ 4.3.6 and
# 4.0.5 in Debian chroots (scripts/setup-rabbitmq-4x.sh) the integration tests need,
# installing them if missing, then runs every unit and integration test against RabbitMQ
# 4.3.6 (RMQ_TEST_BROKER, tests/common), the cross-version set against 4.0.5 and 3.10.8, and
# a short coverage-guided fuzz run of every decoder of untrusted bytes (scripts/fuzz.sh,
# RMQ_BACKUP_FUZZ_SECS seconds per target, default 5; 0 skips it). The fuzz targets and the
# book (scripts/build-docs.sh, mdBook) build beside the tests, and the fuzz run runs beside
# the test groups once the tests are built.
#
# On a fresh machine the set-up (downloads, debootstraps, apt installs: network and disk) and
# the first build (CPU) take the longest; they run at once: the brokers' and emulators' set-up
# in the background, each step's output in a log printed when the build is done, while
# `cargo test --no-run` builds in the foreground. A failed step (or build) is named with its
# log, and the script exits 1 before any test runs. The order the steps need is kept: host
# packages (one apt at a time) and RabbitMQ 3.10.8 first, the test CA before the nodes that
# use it (scripts/setup-rabbitmq-tls.sh before the 4.x nodes start), the 4.x chroots made
# (scripts/setup-rabbitmq-4x.sh prepare) from the start.
set -euo pipefail
cd "$(dirname "$0")/.."
# The main broker of the integration tests; the cross-version set runs again on the others.
export RMQ_TEST_BROKER=${RMQ_TEST_BROKER:-4.3}
# The static binary of tests/static_binary.rs, tests/container_image.rs and tests/packaging.rs
# without the shipped build's optimisation (scripts/build-static.sh; Cargo.toml profile.static-check):
# on a fresh machine the release build alone kept the packaging group busy 25 minutes.
export RMQ_BACKUP_STATIC_PROFILE=${RMQ_BACKUP_STATIC_PROFILE:-static-check}
cross_version=(delivery_limit backup_restore streams stream_offsets tls amqp10_backup amqp10_restore amqp10_conversion)
cross_brokers=(4.0 3.10)
logs=$(mktemp -d)
setup=$(mktemp -d)
fuzz_log=$(mktemp)
docs_log=$(mktemp)
trap 'rm -rf "$logs" "$setup" "$fuzz_log" "$docs_log"' EXIT
sudo=""; [[ $(id -u) -ne 0 ]] && sudo=sudo
export DEBIAN_FRONTEND=noninteractive

# apt_install PACKAGES...: one apt-get on the host (an update first only when it fails).
apt_install() {
    echo "scripts/test.sh: installing $* (apt-get)"
    $sudo apt-get install -y --no-install-recommends "$@" ||
        { $sudo apt-get update && $sudo apt-get install -y --no-install-recommends "$@"; }
}

# step NAME COMMAND...: runs COMMAND with its output in $setup/NAME.log; its exit status in
# $setup/NAME.rc (written last: other steps wait for it).
step() {
    local name=$1 rc=0 start=$SECONDS
    shift
    "$@" >"$setup/$name.log" 2>&1 || rc=$?
    echo "$((SECONDS - start)) s, ended at $SECONDS s" >"$setup/$name.secs"
    echo "$rc" >"$setup/$name.rc"
    return "$rc"
}

# await NAME: waits until step NAME has ended; fails when it failed.
await() {
    until [[ -f "$setup/$1.rc" ]]; do sleep 1; done
    [[ "$(cat "$setup/$1.rc")" == 0 ]]
}

# Tools of the tests: promtool (Debian's prometheus package) for tests/packaging_alerts.rs,
# the Pushgateway (prometheus-pushgateway; tests/metrics_export.rs starts its own on a free
# port, the package's service is not used), a container engine (podman; runc, which runs on
# hosts with hybrid cgroups where crun does not) for tests/container_image.rs, and the age
# tool, with which tests/encryption.rs decrypts a stored segment; python3-qpid-proton, an AMQP
# 1.0 client that is not ours (tests/amqp10_client.rs); zsh and fish, whose syntax
# checks tests/completions.rs runs on the generated completions; curl and python3 for
# scripts/restore-drill.sh (tests/restore_drill.rs). --no-install-recommends
# keeps the Prometheus server's extras out (on a host running systemd the package starts its
# own server on :9090; the tests use only promtool).
test_tools() {
    local missing=()
    command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
    command -v prometheus-pushgateway >/dev/null 2>&1 || missing+=(prometheus-pushgateway)
    command -v podman >/dev/null 2>&1 || missing+=(podman)
    command -v runc >/dev/null 2>&1 || missing+=(runc)
    command -v age >/dev/null 2>&1 || missing+=(age)
    # Debian's qpid-proton for /usr/bin/python3: the AMQP 1.0 oracle of tests/amqp10_client.rs.
    /usr/bin/python3 -c 'import proton' >/dev/null 2>&1 || missing+=(python3-qpid-proton)
    command -v zsh >/dev/null 2>&1 || missing+=(zsh)
    command -v fish >/dev/null 2>&1 || missing+=(fish)
    command -v curl >/dev/null 2>&1 || missing+=(curl)
    command -v python3 >/dev/null 2>&1 || missing+=(python3)
    [[ ${#missing[@]} -eq 0 ]] || apt_install "${missing[@]}"
}

# debootstrap first (small, one apt-get): the 4.x chroots, the longest step, start at once;
# every other apt-get on the host runs in the one chain below, one after the other.
if ! command -v debootstrap >/dev/null 2>&1; then
    apt_install debootstrap >&2
fi
# The steps, in the background: the 4.x chroots (debootstrap and apt-get inside them); the
# object-storage emulators (pip, npm); on the host, the tests' tools, RabbitMQ 3.10.8, the TLS
# nodes and the test CA, the three-node cluster, then the 4.x nodes once their chroots exist.
step chroots scripts/setup-rabbitmq-4x.sh prepare &
setup_jobs=($!)
step storage scripts/setup-storage.sh &
setup_jobs+=($!)
(
    step tools test_tools &&
        step rabbitmq scripts/setup-rabbitmq.sh &&
        step tls scripts/setup-rabbitmq-tls.sh &&
        step cluster scripts/setup-rabbitmq-cluster.sh &&
        await chroots &&
        step rabbitmq-4x scripts/setup-rabbitmq-4x.sh
) &
setup_jobs+=($!)
setup_steps=(tools chroots storage rabbitmq tls cluster rabbitmq-4x)

fuzz_secs=${RMQ_BACKUP_FUZZ_SECS:-5}
# Seconds-long runs: the targets built without optimisation (scripts/fuzz.sh), which takes a
# fraction of the release build's CPU (12 minutes beside the tests' build on a fresh machine).
export RMQ_BACKUP_FUZZ_PROFILE=${RMQ_BACKUP_FUZZ_PROFILE:-dev}
# The fuzz run follows its build and, so as not to slow the tests' build, waits for it (the
# marker file $logs/built): it then runs beside the test groups (80 s of one core), where it
# ran after them. A run that stops before the tests are built leaves no waiting job behind.
if [[ $fuzz_secs -gt 0 ]]; then
    (
        scripts/fuzz.sh build || exit
        until [[ -f $logs/built ]]; do
            [[ -d $logs ]] || exit 1
            sleep 1
        done
        echo "scripts/test.sh: the fuzz run starts at $SECONDS s"
        scripts/fuzz.sh "$fuzz_secs"
    ) >"$fuzz_log" 2>&1 &
    fuzz_job=$!
fi
# The book (docs/, mdBook): built beside the tests; tests/docs_links.rs checks its links.
scripts/build-docs.sh >"$docs_log" 2>&1 &
docs_build=$!
build_rc=0
cargo test --locked --no-run "$@" || build_rc=$?
echo "scripts/test.sh: the tests built at $SECONDS s"
[[ $build_rc -ne 0 ]] || : >"$logs/built"
# Every step ends (one killed halfway could leave apt or a chroot half made), then each
# step's output is printed, in order; a failed or skipped step fails the run.
for job in "${setup_jobs[@]}"; do wait "$job" || true; done
setup_failed=()
for s in "${setup_steps[@]}"; do
    [[ -f "$setup/$s.log" ]] || { setup_failed+=("$s: not run, an earlier step failed"); continue; }
    echo "=== set-up step: $s ($(cat "$setup/$s.secs" 2>/dev/null)) ==="
    cat "$setup/$s.log"
    rc=$(cat "$setup/$s.rc" 2>/dev/null || echo none)
    [[ $rc == 0 ]] || setup_failed+=("$s: failed (exit $rc, its output above)")
done
if [[ ${#setup_failed[@]} -gt 0 || $build_rc -ne 0 ]]; then
    for s in "${setup_failed[@]}"; do echo "scripts/test.sh: set-up step $s" >&2; done
    [[ $build_rc -eq 0 ]] || echo "scripts/test.sh: cargo test --no-run failed (exit $build_rc)" >&2
    exit 1
fi
# Every test built (above), the groups run at once (most tests wait on a broker, not a core):
# the tests that build and install packages, the tests that stop, kill or alarm nodes of the
# test cluster (one binary at a time), the cross-version set on each other broker, the doc
# tests, and all the others, RMQ_TEST_JOBS (default 3) test binaries at a time, each running
# RUST_TEST_THREADS (default 2) of its tests at a time, the longest first. On 2 cores the
# tests are CPU-bound: one binary at a time the group took 40 minutes, 3 x 2 took 18-23, and
# 4 x 4 took as long (22) with single tests 3 times slower (load average 15-30). Each group's
# output is printed when it ends, the pool's binary by binary with its time; the run fails if
# any group fails, and its last lines name what failed.
slow_builds=(packaging static_binary container_image)
cluster=(cluster faults_broker faults_restore)
# The pool's longest binaries, started first (each took 1.5-12 minutes in the suite).
longest=(delivery_limit_4x unacked_at_start faults_backup resume lib deep_quorum shards delivery_limit
    restore_kill_window faults_storage amqp10_restore)
rest=()
for t in "${longest[@]}"; do [[ -f tests/$t.rs || $t == lib ]] && rest+=("$t"); done
rest+=(bins)
for f in tests/*.rs; do
    t=$(basename "$f" .rs)
    [[ " ${slow_builds[*]} ${cluster[*]} ${rest[*]} " == *" $t "* ]] || rest+=("$t")
done
as_args() { local t; for t; do printf -- '--test\n%s\n' "$t"; done; }
run_group() {
    local name=$1 start=$SECONDS
    shift
    # --no-fail-fast: a failed test binary does not hide the others' results (nor their time).
    if cargo test --locked --no-fail-fast "$@" >"$logs/$name" 2>&1; then
        echo ok >"$logs/$name.rc"
    fi
    echo "$((SECONDS - start)) s, ended at $SECONDS s" >"$logs/$name.secs"
}
# pool_one NAME: one binary of the pool (lib: the unit tests, bins: the binary's own), its
# output in $logs/pool.NAME, its time and result in $logs/pool.NAME.secs.
pool_one() {
    local t=$1 start=$SECONDS rc=0 args
    case $t in lib) args=(--lib) ;; bins) args=(--bins) ;; *) args=(--test "$t") ;; esac
    local extra=()
    [[ -z $TEST_SH_ARGS ]] || mapfile -t extra <<<"$TEST_SH_ARGS"
    RUST_TEST_THREADS=${RUST_TEST_THREADS:-2} cargo test --locked "${extra[@]}" "${args[@]}" \
        >"$logs/pool.$t" 2>&1 || rc=$?
    echo "$((SECONDS - start)) s, exit $rc, ended at $(($(date +%s) - TEST_SH_T0)) s" >"$logs/pool.$t.secs"
    [[ $rc == 0 ]]
}
export -f pool_one
# The arguments of this script (cargo test's), one per line, for pool_one.
TEST_SH_ARGS=$(printf '%s\n' "$@")
# The script's start (epoch seconds): each binary's end is told from it.
TEST_SH_T0=$(($(date +%s) - SECONDS))
export logs TEST_SH_ARGS TEST_SH_T0
run_pool() {
    local start=$SECONDS
    if printf '%s\n' "$@" | xargs -P "${RMQ_TEST_JOBS:-3}" -I{} bash -c 'pool_one "$1"' _ {}; then
        echo ok >"$logs/rest.rc"
    fi
    : >"$logs/rest"
    for t; do
        { echo "--- $t ($(cat "$logs/pool.$t.secs" 2>/dev/null || echo "not run"))"; cat "$logs/pool.$t"; } >>"$logs/rest" 2>&1
    done
    echo "$((SECONDS - start)) s, ended at $SECONDS s" >"$logs/rest.secs"
}
mapfile -t slow_args < <(as_args "${slow_builds[@]}")
mapfile -t cluster_args < <(as_args "${cluster[@]}")
run_group packaging "$@" "${slow_args[@]}" &
groups=($!)
run_group cluster "$@" "${cluster_args[@]}" &
groups+=($!)
run_pool "${rest[@]}" &
groups+=($!)
run_group doc "$@" --doc &
groups+=($!)
mapfile -t cross_args < <(as_args "${cross_version[@]}")
for b in "${cross_brokers[@]}"; do
    RMQ_TEST_BROKER=$b run_group "cross-$b" "$@" "${cross_args[@]}" &
    groups+=($!)
done
wait "${groups[@]}"
failed_groups=()
all_groups=(rest cluster packaging doc "${cross_brokers[@]/#/cross-}")
for g in "${all_groups[@]}"; do
    echo "=== test group: $g ($(cat "$logs/$g.secs" 2>/dev/null)) ==="
    cat "$logs/$g"
    [[ -f "$logs/$g.rc" ]] || failed_groups+=("$g")
done
echo "=== the pool's binaries by time ==="
for t in "${rest[@]}"; do echo "$t: $(cat "$logs/pool.$t.secs" 2>/dev/null || echo "not run")"; done |
    sort -t: -k2 -rn
# What failed, last (a CI log may keep only its end): groups, and the pool's binaries.
for t in "${rest[@]}"; do
    grep -q ", exit 0," "$logs/pool.$t.secs" 2>/dev/null || failed_groups+=("rest: $t")
done
echo "=== the book (scripts/build-docs.sh) ==="
cat "$docs_log"
wait "$docs_build" || failed_groups+=("the book (scripts/build-docs.sh)")
if [[ $fuzz_secs -gt 0 ]]; then
    echo "=== the fuzz build and run (scripts/fuzz.sh) ==="
    wait "$fuzz_job" || failed_groups+=("the fuzz build or run (scripts/fuzz.sh)")
    cat "$fuzz_log"
fi
if [[ ${#failed_groups[@]} -gt 0 ]]; then
    # Each failed test's message, short, where a CI log that keeps only its end still shows
    # it (a CI run once named a failed cross-version test and nothing of why).
    echo "=== the failed tests, in short ==="
    for g in "${all_groups[@]}"; do
        awk -v g="$g" '
            /^---- .* stdout ----$/ { n = 0; on = 1; print "[" g "] " $0; next }
            on && (/^stack backtrace:/ || /^failures:$/ || /^note: / || ++n > 12) { on = 0 }
            on { print "[" g "]   " $0 }' "$logs/$g" 2>/dev/null | cut -c1-1000 || true
    done
fi
for g in "${failed_groups[@]}"; do echo "scripts/test.sh: FAILED: $g (its output above)" >&2; done
if [[ ${#failed_groups[@]} -gt 0 ]]; then
    echo "scripts/test.sh: a test group, the book or the fuzz run failed (see above)" >&2
    exit 1
fi
echo "scripts/test.sh: passed in $SECONDS s"
