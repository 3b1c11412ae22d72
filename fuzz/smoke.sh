#!/usr/bin/env bash
# CI smoke for weft's fuzz targets: build every target (cargo-fuzz, nightly), then run each for a few seconds
# starting from its committed seeds (every seed is run first, so a regression in a seed fails here too).
# Needs nightly and cargo-fuzz (fuzz/install.sh). FUZZ_SMOKE_SECS sets the seconds per target (default 4).
# A crash fails the script; the input is left in fuzz/artifacts/<target>/.
set -euo pipefail

cd "$(dirname "$0")/.."
secs="${FUZZ_SMOKE_SECS:-4}"

echo "fuzz smoke: building all targets"
build_start=$(date +%s)
cargo +nightly fuzz build
echo "fuzz smoke: build took $(($(date +%s) - build_start)) s"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for target in $(cargo +nightly fuzz list); do
    echo "fuzz smoke: $target for ${secs} s"
    mkdir -p "$scratch/$target" "fuzz/artifacts/$target"
    # The scratch corpus takes new inputs, so the committed seeds are never written to.
    log="$scratch/$target.log"
    status=0
    cargo +nightly fuzz run "$target" "$scratch/$target" "fuzz/seeds/$target" -- \
        -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 \
        -artifact_prefix="fuzz/artifacts/$target/" -print_final_stats=1 >"$log" 2>&1 || status=$?
    grep -E '^(#[0-9]+.*DONE|stat::number_of_executed_units)' "$log" || true
    if [ "$status" -ne 0 ]; then
        tail -n 60 "$log"
        echo "fuzz smoke: $target FAILED (exit $status); input in fuzz/artifacts/$target/" >&2
        exit "$status"
    fi
done
echo "fuzz smoke: all targets OK"
