#!/usr/bin/env bash
# CI smoke for weft's fuzz targets: build every target (cargo-fuzz, the pinned nightly), then run each for a few
# seconds starting from its committed seeds (every seed is run first, so a regression in a seed fails here too).
# Needs the nightly and cargo-fuzz (install.sh). FUZZ_SMOKE_SECS sets the seconds per target (default 4).
# The smoke builds without optimisation (`--dev`, still with AddressSanitizer and coverage): a few seconds per target
# need no speed, and an optimised single-codegen-unit build costs CI minutes. Long runs: see README.md.
# A crash fails the script; the input is left in artifacts/<target>/.
set -euo pipefail

cd "$(dirname "$0")"
secs="${FUZZ_SMOKE_SECS:-4}"
profile=(--dev)

echo "fuzz smoke: building all targets ($(rustc --version))"
build_start=$(date +%s)
build_log="$(mktemp)"
if ! cargo fuzz build "${profile[@]}" >"$build_log" 2>&1; then
    # cargo-fuzz ends with a long command line and a backtrace that hide the cause, and CI shows the end of the
    # output: the last lines first, then the compiler's own errors, then the disk and memory left.
    echo "--- last lines of the build:"
    tail -n 30 "$build_log"
    echo "--- the compiler's errors:"
    grep -E -A12 '^error' "$build_log" | head -n 80 || true
    echo "--- disk and memory:"
    df -h . /tmp || true
    free -m || true
    echo "fuzz smoke: build FAILED" >&2
    exit 1
fi
echo "fuzz smoke: build took $(($(date +%s) - build_start)) s"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch" "$build_log"' EXIT
for target in $(cargo fuzz list); do
    echo "fuzz smoke: $target for ${secs} s"
    mkdir -p "$scratch/$target" "artifacts/$target"
    # The scratch corpus takes new inputs, so the committed seeds are never written to.
    log="$scratch/$target.log"
    status=0
    cargo fuzz run "${profile[@]}" "$target" "$scratch/$target" "seeds/$target" -- \
        -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 \
        -artifact_prefix="artifacts/$target/" -print_final_stats=1 >"$log" 2>&1 || status=$?
    grep -E '^(#[0-9]+.*DONE|stat::number_of_executed_units)' "$log" || true
    if [ "$status" -ne 0 ]; then
        tail -n 60 "$log"
        echo "fuzz smoke: $target FAILED (exit $status); input in conformance/fuzz/artifacts/$target/" >&2
        exit "$status"
    fi
done
echo "fuzz smoke: all targets OK"
