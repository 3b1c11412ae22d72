#!/usr/bin/env bash
# Installs what smoke.sh and the fuzz targets need, only if missing: the nightly toolchain rust-toolchain.toml pins
# (cargo-fuzz builds with -Zsanitizer=address and SanitizerCoverage) and cargo-fuzz.
set -euo pipefail
cd "$(dirname "$0")"

channel=$(sed -n 's/^channel = "\(.*\)"$/\1/p' rust-toolchain.toml)
[ -n "$channel" ] || { echo "no channel in rust-toolchain.toml" >&2; exit 1; }
if ! rustup toolchain list | grep -q "^$channel"; then
    rustup toolchain install "$channel" --profile minimal
fi
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
cargo fuzz --version
