#!/usr/bin/env bash
# Installs what fuzz/smoke.sh and the fuzz targets need, only if missing: a nightly toolchain (cargo-fuzz builds
# with -Zsanitizer=address and SanitizerCoverage) and cargo-fuzz.
set -euo pipefail

if ! rustup toolchain list | grep -q '^nightly'; then
    rustup toolchain install nightly --profile minimal
fi
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
cargo +nightly fuzz --version
