"""Every flag and environment variable the chart sets is one weft reads: the rendered args and env of each variant
against `weft run --help` (and `weft-control --help`), and against the env names in runtime/node/weft/src."""

from __future__ import annotations

import re

import pytest

from conftest import REPO, run_help
from variants import VARIANTS

FLAG = re.compile(r"^\s+(?:-\w, )?--([a-z0-9][a-z0-9-]*)(\s+<|=<)?", re.M)
ENV = re.compile(r"\[env: ([A-Z][A-Z0-9_]*)=")
POSSIBLE = re.compile(r"\[possible values: ([^\]]+)\]")


# ztunnel's variables the chart sets (when asked) although `weft run` does not read them yet; each is documented as
# such in charts/weft/values.yaml and README.md. test_ztunnel_only_env_is_still_unread fails once weft reads one, so
# the exception and the "does not read" wording go away with it. None now (NETWORK is `weft run --network`).
ZTUNNEL_ONLY_ENV: set[str] = set()


class Flag:
    def __init__(self, takes_value: bool):
        self.takes_value = takes_value
        self.values: set[str] | None = None


def parse_help(text: str) -> tuple[dict[str, Flag], set[str]]:
    """Flags (whether each takes a value, and its possible values where clap lists them) and env names from
    clap's --help."""
    flags: dict[str, Flag] = {}
    current = None
    for line in text.splitlines():
        m = FLAG.match(line)
        if m:
            current = flags[m.group(1)] = Flag(takes_value=m.group(2) is not None)
        p = POSSIBLE.search(line)
        if p and current:
            current.values = {v.strip() for v in p.group(1).split(",")}
    return flags, set(ENV.findall(text))


def source_env_names() -> set[str]:
    """`env = "NAME"` in the CLI definitions (`weft run` in runtime/node/weft/src, `weft-control` in runtime/control/src/ads)."""
    names = set()
    for crate in ("node/weft/src", "control/src/ads"):
        sources = list((REPO / "runtime" / crate).rglob("*.rs"))
        assert sources, f"runtime/{crate} has no Rust sources: did the crate move?"
        for path in sources:
            names |= set(re.findall(r'\benv\s*=\s*"([A-Z][A-Z0-9_]*)"', path.read_text()))
    return names


@pytest.fixture(scope="module")
def run_cli():
    return parse_help(run_help("run"))


def test_help_parsing_sees_every_env_name(run_cli):
    _, help_env = run_cli
    assert help_env, "no [env: ...] in weft run --help"
    assert "NODE_NAME" in help_env and "CA_ADDRESS" in help_env
    assert help_env <= source_env_names()


def check(container, command: str, cli):
    """Every problem at once, so one run lists all that is missing."""
    flags, env_names = cli
    source = source_env_names()
    problems = []
    # `weft run` is the image's entrypoint with `run` first; the control plane is its own binary, `weft-control`.
    if command == "control":
        if container.get("command") != ["/usr/local/bin/weft-control"]:
            problems.append(f"command is {container.get('command')!r}, not the weft-control binary")
        flag_args = container["args"]
    else:
        if container.get("command") is not None or container["args"][0] != command:
            problems.append(f"args[0] is {container['args'][0]!r}, not {command!r} (entrypoint weft)")
        flag_args = container["args"][1:]
    for arg in flag_args:
        name, eq, value = arg.removeprefix("--").partition("=")
        flag = flags.get(name)
        if not arg.startswith("--") or flag is None:
            problems.append(f"{arg}: not a flag of `weft {command}`")
        elif flag.takes_value != bool(eq):
            problems.append(f"{arg}: --{name} {'takes' if flag.takes_value else 'takes no'} value")
        elif flag.values is not None and value not in flag.values:
            problems.append(f"{arg}: weft takes {sorted(flag.values)}")
    # `ISTIO_META_<KEY>` variables are read by prefix, as ztunnel reads them: node metadata `<KEY>` for istiod.
    # ZTUNNEL_ONLY_ENV: set for parity with ztunnel's chart, documented as not read by weft (values.yaml, README).
    meta_prefix = 'const META_PREFIX: &str = "ISTIO_META_";' in (REPO / "runtime/node/xds/src/node.rs").read_text()
    for e in container.get("env", []):
        if meta_prefix and e["name"].startswith("ISTIO_META_"):
            continue
        if command == "run" and e["name"] in ZTUNNEL_ONLY_ENV and e["name"] not in env_names:
            continue
        if e["name"] not in env_names or e["name"] not in source:
            problems.append(f"env {e['name']}: not read by `weft {command}`")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_daemonset_args_and_env_are_weft_run_flags(render, run_cli, variant):
    values = {**VARIANTS[variant], "env": {}}  # `env` is the operator's own
    check(render(values).container(), "run", run_cli)


@pytest.mark.parametrize("mode", ["inpod", "node"])
def test_both_modes(render, run_cli, mode):
    check(render({"mode": mode}).container(), "run", run_cli)


# control-plane is the WeftPlugin controller (--plugins-from-kube, POD_NAME, ...), control-plane-configmap the files.
@pytest.mark.parametrize("variant", ["control-plane", "control-plane-configmap", "control-plane-scoped"])
def test_control_args_are_weft_control_flags(render, variant):
    cli = parse_help(run_help("control"))
    dep = render(VARIANTS[variant]).one("Deployment")
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    check(container, "control", cli)


def test_ztunnel_only_env_is_still_unread(run_cli):
    _, help_env = run_cli
    read = ZTUNNEL_ONLY_ENV & (help_env | source_env_names())
    assert not read, f"weft now reads {sorted(read)}: drop it from ZTUNNEL_ONLY_ENV and the 'does not read' notes"
    values = (REPO / "charts/weft/values.yaml").read_text()
    readme = (REPO / "charts/weft/README.md").read_text()
    for name in ZTUNNEL_ONLY_ENV:
        assert f"does not read {name}" in values and f"does not read {name}" in readme, name
