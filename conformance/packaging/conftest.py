"""Shared helpers for the chart and image checks: real Helm (helm-python-sdk's libhelm_c.so) renders the chart."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "weft"
NAMESPACE = "istio-system"
RELEASE = "weft"


@dataclass
class Rendered:
    """One release's manifests: the objects (parsed) and NOTES.txt."""

    objects: list[dict[str, Any]]
    notes: str
    text: dict[str, str]

    def kinds(self) -> list[str]:
        return sorted(o["kind"] for o in self.objects)

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [o for o in self.objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
        assert len(found) == 1, f"expected one {kind} {name or ''}, got {[o['metadata']['name'] for o in found]}"
        return found[0]

    def daemonset(self) -> dict[str, Any]:
        return self.one("DaemonSet")

    def container(self) -> dict[str, Any]:
        (c,) = self.daemonset()["spec"]["template"]["spec"]["containers"]
        return c


def values_yaml(text: str) -> dict[str, Any]:
    """Values exactly as `helm install -f file.yaml` reads them (Helm's own YAML decoding, numbers and all)."""
    return helm.values_from_yaml(text)


@pytest.fixture(scope="session")
def chart():
    c = helm.Chart.load(CHART)
    yield c
    c.close()


@pytest.fixture(scope="session")
def render(chart):
    def _render(values: dict[str, Any] | None = None, name: str = RELEASE, namespace: str = NAMESPACE) -> Rendered:
        out = chart.render(values=values, name=name, namespace=namespace, is_install=True)
        objects: list[dict[str, Any]] = []
        notes = ""
        for path, text in sorted(out.items()):
            if path.endswith("NOTES.txt"):
                notes = text
                continue
            for doc in yaml.safe_load_all(text):
                if doc is not None:
                    objects.append(doc)
        return Rendered(objects=objects, notes=notes, text=out)

    return _render


def weft_bin() -> Path:
    """The weft binary .ci/test builds (target/debug/weft), or $WEFT_BIN."""
    p = Path(os.environ.get("WEFT_BIN", REPO / "target" / "debug" / "weft"))
    assert p.is_file(), f"{p} is missing: build it first (cargo build -p weft)"
    return p


def control_bin() -> Path:
    """The control plane binary .ci/test builds (target/debug/weft-control), or $WEFT_CONTROL_BIN."""
    p = Path(os.environ.get("WEFT_CONTROL_BIN", REPO / "target" / "debug" / "weft-control"))
    assert p.is_file(), f"{p} is missing: build it first (cargo build -p weft-control)"
    return p


def run_help(*args: str) -> str:
    """`weft <args> --help`; with `control` first, `weft-control --help` (the control plane's own binary)."""
    cmd = [str(control_bin()), *args[1:]] if args[:1] == ("control",) else [str(weft_bin()), *args]
    out = subprocess.run([*cmd, "--help"], capture_output=True, text=True, check=False)
    assert out.returncode == 0, f"{' '.join(cmd)} --help failed: {out.stderr}"
    return out.stdout
