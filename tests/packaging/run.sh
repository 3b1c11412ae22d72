#!/usr/bin/env bash
# Runs the chart and image checks (tests/packaging) with the virtualenv install.sh made. The flag comparison needs
# the weft binary: target/debug/weft by default, or $WEFT_BIN.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${WEFT_PACKAGING_VENV:-$repo/target/packaging-venv}"
if [[ ! -x "$venv/bin/python" ]]; then
    echo "no virtualenv at $venv: run tests/packaging/install.sh (.ci/run does)" >&2
    exit 1
fi
cd "$repo"
exec "$venv/bin/python" -m pytest -p no:cacheprovider -q "$here" "$@"
