"""The local config file the chart writes is one weft loads: the rendered ConfigMap (trial mesh, plugins from a
ConfigMap) given to a real `weft run`, which must apply it, load the plugin and report ready."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import yaml

from conftest import REPO, weft_bin
from variants import VARIANTS

# An event wait, not a timing: generous so a loaded machine never fails it.
WAIT_SECONDS = 120
LISTENERS_OFF = ["--outbound=off", "--inbound-plaintext=off", "--hbone=off", "--socks5=off", "--admin=off", "--metrics=off"]


def plugin_wasm(name: str) -> Path:
    """A plugin .ci/test built (`cargo build --manifest-path plugins/Cargo.toml --target wasm32-wasip2`)."""
    target = Path(os.environ.get("WEFT_WASM_TARGET_DIR", REPO / "target-wasm"))
    path = target / "wasm32-wasip2" / "release" / f"{name}.wasm"
    assert path.is_file(), f"{path} is missing: build the plugins first (README: plugins)"
    return path


def config_of(rendered) -> str:
    return rendered.one("ConfigMap")["data"]["config.yaml"]


class Weft:
    """`weft run` with JSON logs, read line by line on a thread."""

    def __init__(self, tmp: Path, config: Path, node: str):
        ca = tmp / "ca"
        subprocess.run([str(weft_bin()), "ca", "init", "--out", str(ca)], check=True, capture_output=True)
        self.proc = subprocess.Popen(
            [str(weft_bin()), "run", f"--node={node}", f"--config={config}", f"--ca-dir={ca}", "--log-format=json",
             "--readiness=127.0.0.1:0", *LISTENERS_OFF],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, message: str) -> dict:
        while True:
            try:
                line = self.lines.get(timeout=WAIT_SECONDS)
            except queue.Empty:
                raise AssertionError(f"no {message!r} within {WAIT_SECONDS} s; log:\n" + "".join(self.seen)) from None
            if line is None:
                raise AssertionError(f"weft exited ({self.proc.wait()}) before {message!r}; log:\n" + "".join(self.seen))
            self.seen.append(line)
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("message") == message:
                return event

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=WAIT_SECONDS) == 0


def test_trial_mesh_loads(render, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(config_of(render(VARIANTS["trial-local-ca"])))
    weft = Weft(tmp_path, config, node="kind-control-plane")
    try:
        applied = weft.wait_for("config applied")
        assert (applied["workloads"], applied["services"], applied["policies"]) == (1, 1, 0), applied
        weft.wait_for("weft ready to serve")
    finally:
        weft.stop()


def test_plugins_from_a_configmap_load(render, tmp_path):
    # The ConfigMap's keys, where the pod would mount them (/etc/weft/plugins).
    mounted = tmp_path / "plugins"
    mounted.mkdir()
    wasm = shutil.copy(plugin_wasm("port_allowlist"), mounted / "port_allowlist.wasm")
    values = json.loads(json.dumps(VARIANTS["plugins-from-configmap"]))
    values["plugins"]["local"][0]["sha256"] = hashlib.sha256(Path(wasm).read_bytes()).hexdigest()
    text = config_of(render(values))
    assert "/etc/weft/plugins/port_allowlist.wasm" in text
    config = tmp_path / "config.yaml"
    config.write_text(text.replace("/etc/weft/plugins/", f"{mounted}/"))
    assert yaml.safe_load(config.read_text())["plugins"][0]["path"] == str(mounted / "port_allowlist.wasm")
    weft = Weft(tmp_path, config, node="node-a")
    try:
        assert weft.wait_for("config applied")["plugins"] == 1
        while True:
            loaded = weft.wait_for("plugin loaded")
            if loaded["plugin"] == "allowlist":
                assert loaded["sha256"] == values["plugins"]["local"][0]["sha256"]
                break
        weft.wait_for("weft ready to serve")
    finally:
        weft.stop()
