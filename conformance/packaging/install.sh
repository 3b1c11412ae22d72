#!/usr/bin/env bash
# Installs what conformance/packaging needs into a virtualenv (default target/packaging-venv, or $WEFT_PACKAGING_VENV):
# real Helm (helm-python-sdk bundles Helm's Go library as libhelm_c.so), kubernetes-validate with its Kubernetes
# schemas, hadolint, dockerfile-parse, cel-python and pytest, all pinned in requirements.txt. Reinstalls only when
# requirements.txt changed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${WEFT_PACKAGING_VENV:-$repo/target/packaging-venv}"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)"
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "packaging venv up to date: $venv"
    exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$here/requirements.txt"
echo "$want" >"$stamp"
echo "packaging venv installed: $venv"
