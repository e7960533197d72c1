#!/usr/bin/env bash
# Coverage-guided fuzzing of the decoders of untrusted bytes (fuzz/, cargo-fuzz + libFuzzer).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default 60 s, every target)
#   scripts/fuzz.sh build                                (build the targets only)
#
# Installs the nightly toolchain and cargo-fuzz when missing, builds every target once, then
# runs the targets one at a time for SECONDS_PER_TARGET each (-rss_limit_mb=256 -timeout=10),
# starting from the seeds of fuzz/corpus/<target>/ (read only) and the inputs earlier runs
# found (fuzz/work/<target>/, git-ignored). Prints one line per target: executions,
# executions per second and the result. A crashing, hanging or memory-hungry input is written
# to fuzz/artifacts/<target>/ (git-ignored); the exit status is then 1. Logs are kept in
# fuzz/work/logs/<target>.log. CARGO_TARGET_DIR is honoured (default fuzz/target).
# RMQ_BACKUP_FUZZ_PROFILE=dev builds without optimisation (cargo fuzz build --dev): a fraction
# of the release build's CPU, for the suite's seconds-long runs (scripts/test.sh sets it);
# the default, release, is for runs long enough to find something new.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-60}
[[ $# -gt 0 ]] && shift
if [[ $secs != build ]] && { ! [[ $secs =~ ^[0-9]+$ ]] || [[ $secs -lt 1 ]]; }; then
    echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...] | scripts/fuzz.sh build" >&2
    exit 2
fi

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "installing the nightly toolchain (cargo-fuzz needs it)" >&2
    rustup toolchain install nightly --profile minimal >/dev/null
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked --quiet
fi

target_dir=${CARGO_TARGET_DIR:-$PWD/fuzz/target}
host=$(rustc +nightly -vV | sed -n 's/^host: //p')
case ${RMQ_BACKUP_FUZZ_PROFILE:-release} in
    release) mode=(--release); bin_dir=$target_dir/$host/release ;;
    dev) mode=(--dev); bin_dir=$target_dir/$host/debug ;;
    *) echo "RMQ_BACKUP_FUZZ_PROFILE: release or dev, not ${RMQ_BACKUP_FUZZ_PROFILE}" >&2; exit 2 ;;
esac

if [[ $# -gt 0 ]]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +nightly fuzz list)
fi

mkdir -p fuzz/work/logs
echo "building the fuzz targets" >&2
# No sanitizer: the crate has no unsafe code, and AddressSanitizer's allocator caches alone
# take the memory of a long run past -rss_limit_mb=256. Coverage instrumentation stays.
if ! cargo +nightly fuzz build "${mode[@]}" --sanitizer none --target-dir "$target_dir" \
    >fuzz/work/logs/build.log 2>&1; then
    tail -n 30 fuzz/work/logs/build.log >&2
    echo "fuzz targets do not build (fuzz/work/logs/build.log)" >&2
    exit 1
fi

[[ $secs == build ]] && exit 0

# The segment target writes each input to a file under $TMPDIR.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

failed=0
for t in "${targets[@]}"; do
    log=fuzz/work/logs/$t.log
    mkdir -p "fuzz/work/$t" "fuzz/corpus/$t" "fuzz/artifacts/$t"
    status=0
    if [[ ! -x $bin_dir/$t ]]; then
        printf '%-16s %12s execs %8s exec/s  %s\n' "$t" - - "NO SUCH TARGET"
        failed=1
        continue
    fi
    TMPDIR=$scratch "$bin_dir/$t" -artifact_prefix="fuzz/artifacts/$t/" \
        -max_total_time="$secs" -rss_limit_mb=256 -timeout=10 -print_final_stats=1 \
        "fuzz/work/$t" "fuzz/corpus/$t" >"$log" 2>&1 || status=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
    if [[ $status -eq 0 ]]; then
        result=ok
    elif grep -q 'ERROR: libFuzzer: timeout' "$log"; then
        result="TIMEOUT ${artifact}"
    elif grep -q 'ERROR: libFuzzer: out-of-memory' "$log"; then
        result="OUT OF MEMORY ${artifact}"
    elif [[ -n $artifact ]]; then
        result="CRASH ${artifact}"
    else
        result="FAILED (exit $status, see $log)"
    fi
    [[ $result == ok ]] || failed=1
    printf '%-16s %12s execs %8s exec/s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "$result"
done
exit "$failed"
