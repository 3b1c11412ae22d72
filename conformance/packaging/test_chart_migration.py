"""Installing beside Istio's ztunnel chart and migrating off it (issue #43, "Install beside ztunnel"): migration mode,
the ztunnel look-alike labels, ztunnel's address forms, NETWORK, a ClusterTrustBundle for the mesh root, SELinux
options, image pull secrets in ztunnel's form, and the README's runbook.

Istio artefacts used as fixtures or facts, all from istio/istio at commit 86c9f01fd735fb01d8192f5bcaf0d424afb7f14c:

- `manifests/charts/ztunnel` (vendored, fixtures/istio-ztunnel-chart/ztunnel; Apache-2.0): rendered with real Helm.
  With every optional part on (platform openshift, global.networkPolicy.enabled, resourceQuotas.enabled) it renders
  DaemonSet, ServiceAccount, NetworkPolicy and ResourceQuota `ztunnel` in its namespace, and ClusterRole and
  ClusterRoleBinding `ztunnel`; by default only the DaemonSet and the ServiceAccount. It creates no ConfigMap (the
  mesh root ConfigMap `istio-ca-root-cert` is istiod's).
- `cni/pkg/util/podutil.go` `IsZtunnelPod`: a pod is a node proxy when it is in istio-cni's system namespace and its
  label `app` is `ztunnel`.
- `istioctl/pkg/util/ambient/util.go` `IsZtunnelPod`: label `app` equal to `ztunnel` when the label is present, else
  a pod name starting with `ztunnel`.
- `tools/bug-report/pkg/common/common.go` `ProxyContainerName`: `istio-proxy`.
"""

from __future__ import annotations

import copy
import json
import os
import queue
import re
import shlex
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from conftest import CHART, NAMESPACE, REPO, weft_bin
from variants import VARIANTS

ISTIO_COMMIT = "86c9f01fd735fb01d8192f5bcaf0d424afb7f14c"
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "istio-ztunnel-chart"
ZTUNNEL_CHART = FIXTURE / "ztunnel"
MIRROR = Path("/work/.mirror/istio+istio/repo")
# Everything Istio's ztunnel chart can render at once.
ZTUNNEL_ALL_PARTS = {"platform": "openshift", "global": {"networkPolicy": {"enabled": True}}, "resourceQuotas": {"enabled": True}}
MIGRATION = VARIANTS["migration-from-ztunnel"]
COMPATIBLE = VARIANTS["ztunnel-compatible"]


def objects_of(out: dict[str, str]) -> list[dict[str, Any]]:
    return [d for path, text in sorted(out.items()) if not path.endswith("NOTES.txt") for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="module")
def ztunnel():
    """Istio's ztunnel chart rendered with real Helm: values -> objects."""
    chart = helm.Chart.load(ZTUNNEL_CHART)

    def _render(values: dict[str, Any] | None = None, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
        return objects_of(chart.render(values=values or {}, name="ztunnel", namespace=namespace, is_install=True))

    yield _render
    chart.close()


def keys(objects) -> set[tuple[str, str | None, str]]:
    return {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects}


def pod_template(objects, kind="DaemonSet") -> dict[str, Any]:
    (ds,) = [o for o in objects if o["kind"] == kind]
    return ds["spec"]["template"]


def env_of(container) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


# --- the fixture is Istio's chart ------------------------------------------------------------------------------------


def test_fixture_cites_its_source_and_keeps_the_licence():
    readme = (FIXTURE / "README.md").read_text()
    assert ISTIO_COMMIT in readme and "manifests/charts/ztunnel" in readme and "Apache License 2.0" in readme
    assert "Apache License" in (FIXTURE / "LICENSE").read_text()
    assert yaml.safe_load((ZTUNNEL_CHART / "Chart.yaml").read_text())["name"] == "ztunnel"


@pytest.mark.skipif(not MIRROR.is_dir(), reason="no local mirror of istio/istio (CI has none)")
def test_fixture_is_the_chart_at_the_cited_commit():
    for path in sorted(p for p in ZTUNNEL_CHART.rglob("*") if p.is_file()):
        rel = path.relative_to(ZTUNNEL_CHART).as_posix()
        upstream = subprocess.run(["git", "-C", str(MIRROR), "show", f"{ISTIO_COMMIT}:manifests/charts/ztunnel/{rel}"],
                                  capture_output=True, check=True).stdout
        assert path.read_bytes() == upstream, rel


def test_ztunnel_chart_renders_what_the_docstring_lists(ztunnel):
    assert keys(ztunnel()) == {("DaemonSet", NAMESPACE, "ztunnel"), ("ServiceAccount", NAMESPACE, "ztunnel")}
    assert keys(ztunnel(ZTUNNEL_ALL_PARTS)) == {
        ("DaemonSet", NAMESPACE, "ztunnel"),
        ("ServiceAccount", NAMESPACE, "ztunnel"),
        ("NetworkPolicy", NAMESPACE, "ztunnel"),
        ("ResourceQuota", NAMESPACE, "ztunnel"),
        ("ClusterRole", None, "ztunnel"),
        ("ClusterRoleBinding", None, "ztunnel"),
    }


# --- migration mode ---------------------------------------------------------------------------------------------------


def test_migration_mode_runs_as_ztunnels_account_without_creating_it(render):
    r = render(MIGRATION)
    assert "ServiceAccount" not in r.kinds()
    assert r.daemonset()["spec"]["template"]["spec"]["serviceAccountName"] == "ztunnel"
    assert "Migration mode" in r.notes and f"{NAMESPACE}/ztunnel" in r.notes
    # Even with serviceAccount.create left on: the one switch is enough.
    r = render({**MIGRATION, "serviceAccount": {"create": True, "name": "ztunnel"}})
    assert "ServiceAccount" not in r.kinds()
    # weft-control admits the node agents by that same account.
    r = render({**MIGRATION, **{k: VARIANTS["control-plane"][k] for k in ["control"]}})
    (c,) = r.one("Deployment")["spec"]["template"]["spec"]["containers"]
    assert f"--node-accounts={NAMESPACE}/ztunnel" in c["args"]
    # Without migration mode the chart creates it (and collides with ztunnel's, below).
    assert render({"migration": {"fromZtunnel": False}}).one("ServiceAccount")["metadata"]["name"] == "ztunnel"


@pytest.mark.parametrize("kube", ["1.30.0", kubernetes_validate.latest_version()])
@pytest.mark.parametrize("variant", ["migration-from-ztunnel", "ztunnel-compatible"])
def test_migration_mode_validates_strict(render, variant, kube):
    objects = render(VARIANTS[variant]).objects
    assert [o["kind"] for o in objects] == ["DaemonSet"]
    for obj in objects:
        kubernetes_validate.validate(obj, kube, strict=True)


def every_weft_object(render, extra: dict[str, Any]) -> list[dict[str, Any]]:
    """weft's chart with every kind of object it can create (control plane, PodMonitor, local config)."""
    values = copy.deepcopy(VARIANTS["everything"])
    values["plugins"]["local"] = [{"name": "a", "kind": "telemetry", "path": "/opt/a.wasm"}]
    values.update(extra)
    return render(values).objects


def test_no_object_shared_with_istios_ztunnel_chart(render, ztunnel):
    """The collision the issue reports (weft's chart creating ServiceAccount `ztunnel`, which Helm then refuses to
    install beside ztunnel's release) is the only one, and migration mode removes it."""
    theirs = keys(ztunnel(ZTUNNEL_ALL_PARTS)) | keys(ztunnel())
    for extra in [MIGRATION, COMPATIBLE]:
        ours = keys(every_weft_object(render, extra))
        assert {k for k, _, _ in ours} >= {"DaemonSet", "ConfigMap", "Deployment", "Service", "ClusterRole",
                                          "ClusterRoleBinding", "ServiceAccount", "PodMonitor"}
        assert not ours & theirs, ours & theirs
    # What a plain install collides on.
    assert keys(every_weft_object(render, {})) & theirs == {("ServiceAccount", NAMESPACE, "ztunnel")}
    # ztunnel installed with its own names (resourceName): weft runs as that account, still sharing nothing.
    theirs = keys(ztunnel({**ZTUNNEL_ALL_PARTS, "resourceName": "mesh-node"}))
    ours = every_weft_object(render, {**MIGRATION, "serviceAccount": {"create": True, "name": "mesh-node"}})
    assert ("ServiceAccount", NAMESPACE, "mesh-node") in theirs and not keys(ours) & theirs
    (ds,) = [o for o in ours if o["kind"] == "DaemonSet"]
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == "mesh-node"


def test_migration_mode_refuses_a_daemonset_named_ztunnel(render):
    with pytest.raises(helm.HelmError, match="would be named ztunnel"):
        render({**MIGRATION, "fullnameOverride": "ztunnel"})
    render({"fullnameOverride": "ztunnel"})  # without ztunnel's chart beside it, the name is free


def test_selectors_do_not_cross(render, ztunnel):
    ours = render(COMPATIBLE).daemonset()
    (theirs,) = [o for o in ztunnel() if o["kind"] == "DaemonSet"]
    our_selector = ours["spec"]["selector"]["matchLabels"]
    assert not our_selector.items() <= theirs["spec"]["template"]["metadata"]["labels"].items()
    # ztunnel's selector (app: ztunnel) does match weft's look-alike pods: README says why that is harmless.
    assert theirs["spec"]["selector"]["matchLabels"].items() <= ours["spec"]["template"]["metadata"]["labels"].items()


# --- looking like ztunnel ---------------------------------------------------------------------------------------------


def cni_is_ztunnel_pod(system_namespace: str, namespace: str, labels: dict[str, str]) -> bool:
    """istio-cni's rule (cni/pkg/util/podutil.go)."""
    return namespace == system_namespace and labels.get("app") == "ztunnel"


def istioctl_is_ztunnel_pod(name: str, labels: dict[str, str]) -> bool:
    """istioctl's rule (istioctl/pkg/util/ambient/util.go)."""
    return labels["app"] == "ztunnel" if "app" in labels else name.startswith("ztunnel")


def test_ztunnel_labels_make_weft_a_ztunnel_pod_to_istio(render, ztunnel):
    # The rules, checked on ztunnel's own pods first.
    theirs = pod_template(ztunnel())
    assert cni_is_ztunnel_pod(NAMESPACE, NAMESPACE, theirs["metadata"]["labels"])
    assert istioctl_is_ztunnel_pod("ztunnel-abcde", theirs["metadata"]["labels"])
    (their_container,) = theirs["spec"]["containers"]

    r = render({"ztunnelLabels": True})
    ds = r.daemonset()
    labels = ds["spec"]["template"]["metadata"]["labels"]
    namespace = ds["metadata"]["namespace"]
    assert cni_is_ztunnel_pod(NAMESPACE, namespace, labels)
    assert istioctl_is_ztunnel_pod("weft-abcde", labels)
    assert r.container()["name"] == their_container["name"] == "istio-proxy"
    # Still never captured nor injected, and the selector is unchanged (a DaemonSet's selector is immutable).
    assert labels["istio.io/dataplane-mode"] == "none" and labels["sidecar.istio.io/inject"] == "false"
    assert ds["spec"]["selector"] == render().daemonset()["spec"]["selector"]

    r = render()
    labels = r.daemonset()["spec"]["template"]["metadata"]["labels"]
    assert not cni_is_ztunnel_pod(NAMESPACE, NAMESPACE, labels)
    assert not istioctl_is_ztunnel_pod("weft-abcde", labels)
    assert r.container()["name"] == "weft"


# --- ztunnel's values, taken by weft's chart -------------------------------------------------------------------------


def test_ztunnels_bare_addresses_reach_weft_with_https(render, ztunnel):
    bare = "istiod.istio-system.svc:15012"
    # ztunnel's chart writes exactly this form.
    (their_container,) = pod_template(ztunnel())["spec"]["containers"]
    assert env_of(their_container)["CA_ADDRESS"] == env_of(their_container)["XDS_ADDRESS"] == bare
    env = env_of(render({"istio": {"caAddress": bare, "xdsAddress": "istiod-canary.istio-system.svc:15012"}}).container())
    assert env["CA_ADDRESS"] == f"https://{bare}"
    assert env["XDS_ADDRESS"] == "https://istiod-canary.istio-system.svc:15012"
    env = env_of(render({"istio": {"caAddress": "http://127.0.0.1:15012"}}).container())
    assert env["CA_ADDRESS"] == "http://127.0.0.1:15012", "a scheme is kept as written"
    r = render({"plugins": {"xds": {"address": "weft-control.istio-system.svc:15012"}}})
    assert "--plugin-xds-address=https://weft-control.istio-system.svc:15012" in r.container()["args"]


class Weft:
    """`weft run` as the DaemonSet runs it, paths moved under a temporary directory, JSON logs read on a thread."""

    def __init__(self, tmp: Path, container: dict[str, Any], env: dict[str, str]):
        moves = {"/var/run/ztunnel": tmp / "cni", "/var/run/secrets/istio": tmp / "istio",
                 "/var/run/secrets/tokens": tmp / "tokens", "/var/lib/weft": tmp / "state"}
        for d in moves.values():
            d.mkdir()
        subprocess.run([str(weft_bin()), "ca", "init", "--out", str(tmp / "ca")], check=True, capture_output=True)
        (moves["/var/run/secrets/istio"] / "root-cert.pem").write_bytes((tmp / "ca" / "root-cert.pem").read_bytes())
        (moves["/var/run/secrets/tokens"] / "istio-token").write_text("token\n")
        args = []
        for a in container["args"]:
            for old, new in moves.items():
                a = a.replace(f"={old}", f"={new}")
            args.append(a)
        args = [a for a in args if not a.startswith("--mark=")]  # SO_MARK needs CAP_NET_ADMIN
        self.proc = subprocess.Popen(
            [str(weft_bin()), *args, "--admin=off", "--metrics=off", "--readiness=127.0.0.1:0"],
            env={"PATH": os.environ.get("PATH", ""), **env, "WEFT_LOG": "info"},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def first_of(self, *messages: str) -> str:
        """The first of `messages` weft logs, or what it printed before exiting."""
        while True:
            line = self.lines.get(timeout=120)
            if line is None:
                return "exited: " + "".join(self.seen)
            self.seen.append(line)
            try:
                message = json.loads(line).get("message", "")
            except json.JSONDecodeError:
                message = line
            for m in messages:
                if m in message:
                    return m

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)


@pytest.mark.parametrize("address", ["istiod.invalid:15012", "https://istiod.invalid:15012"])
def test_weft_starts_with_the_rendered_ztunnel_style_address(render, tmp_path, address):
    """The rendered command line and environment of migration mode, given to a real `weft run`: it gets past the CA
    client (which refuses an address without a scheme) and starts; istiod.invalid is never reached."""
    r = render({**COMPATIBLE, "istio": {**COMPATIBLE["istio"], "caAddress": address, "xdsAddress": address}})
    c = r.container()
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    env.update(NODE_NAME="node-a", POD_NAME="weft-abcde", POD_NAMESPACE=NAMESPACE, INSTANCE_IP="10.0.0.5")
    assert env["CA_ADDRESS"] == "https://istiod.invalid:15012"
    weft = Weft(tmp_path, c, env)
    try:
        assert weft.first_of("weft starting", "CA address") == "weft starting", "".join(weft.seen)
    finally:
        weft.stop()


def test_an_unnormalised_bare_address_is_what_weft_refuses(render, tmp_path):
    # Proof that the chart's https:// matters: the same command line with the bare address as ztunnel writes it.
    c = render(COMPATIBLE).container()
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    env.update(NODE_NAME="node-a", POD_NAME="weft-abcde", POD_NAMESPACE=NAMESPACE, CA_ADDRESS="istiod.invalid:15012")
    weft = Weft(tmp_path, c, env)
    try:
        outcome = weft.first_of("weft starting")
        assert outcome.startswith("exited: ") and "expected https://host:port" in outcome, outcome
    finally:
        weft.stop()


def test_network_env(render, ztunnel):
    (their_container,) = pod_template(ztunnel({"network": "network-east"}))["spec"]["containers"]
    assert env_of(their_container)["NETWORK"] == "network-east"
    assert env_of(render({"network": "network-east"}).container())["NETWORK"] == "network-east"
    assert "NETWORK" not in env_of(render().container())


def test_trust_bundle_from_a_cluster_trust_bundle(render, ztunnel):
    r = render({"istio": {"clusterTrustBundle": "istio.io:istiod-ca:root-cert"}})
    c = r.container()
    vols = {v["name"]: v for v in r.daemonset()["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert "configMap" not in vols["istio-root-cert"]
    (source,) = vols["istio-root-cert"]["projected"]["sources"]
    assert source == {"clusterTrustBundle": {"name": "istio.io:istiod-ca:root-cert", "path": "root-cert.pem"}}
    root = f"{mounts['istio-root-cert']}/{source['clusterTrustBundle']['path']}"
    args = dict(a[2:].split("=", 1) for a in c["args"][1:])
    assert args["ca-root-cert"] == args["xds-root-cert"] == root == "/var/run/secrets/istio/root-cert.pem"
    # ztunnel's chart projects the same bundle at the same path when asked to.
    theirs = pod_template(ztunnel({"env": {"ENABLE_CLUSTER_TRUST_BUNDLE_API": True}}))
    (their_vol,) = [v for v in theirs["spec"]["volumes"] if "projected" in v and "clusterTrustBundle" in v["projected"]["sources"][0]]
    (their_mount,) = [m for m in theirs["spec"]["containers"][0]["volumeMounts"] if m["name"] == their_vol["name"]]
    their_source = their_vol["projected"]["sources"][0]["clusterTrustBundle"]
    assert f"{their_mount['mountPath']}/{their_source['path']}" == root
    assert their_source["name"] == "istio.io:istiod-ca:root-cert"
    # Default: istiod's ConfigMap.
    vols = {v["name"]: v for v in render().daemonset()["spec"]["template"]["spec"]["volumes"]}
    assert vols["istio-root-cert"] == {"name": "istio-root-cert", "configMap": {"name": "istio-ca-root-cert"}}


def test_selinux_options_as_ztunnels(render, ztunnel):
    options = {"type": "spc_t", "level": "s0:c123,c456"}
    (their_container,) = pod_template(ztunnel({"seLinuxOptions": options}))["spec"]["containers"]
    ours = render({"seLinuxOptions": options}).container()
    assert ours["securityContext"]["seLinuxOptions"] == their_container["securityContext"]["seLinuxOptions"] == options
    assert "seLinuxOptions" not in render().container()["securityContext"]
    # ztunnel's OpenShift platform profile sets exactly what the README says to set.
    (their_container,) = pod_template(ztunnel({"platform": "openshift"}))["spec"]["containers"]
    assert their_container["securityContext"]["seLinuxOptions"] == {"type": "spc_t"}
    assert "{type: spc_t}" in (CHART / "README.md").read_text()


def test_image_pull_secrets_in_either_form(render, ztunnel):
    want = [{"name": "regcred"}, {"name": "mirror-creds"}]
    for given in (["regcred", "mirror-creds"], [{"name": "regcred"}, {"name": "mirror-creds"}], ["regcred", {"name": "mirror-creds"}]):
        r = render({"imagePullSecrets": given, **{k: VARIANTS["control-plane"][k] for k in ["control"]}})
        assert r.daemonset()["spec"]["template"]["spec"]["imagePullSecrets"] == want
        assert r.one("Deployment")["spec"]["template"]["spec"]["imagePullSecrets"] == want
    assert "imagePullSecrets" not in render().daemonset()["spec"]["template"]["spec"]
    # ztunnel's chart takes names; the same value works for weft's.
    (sa,) = [o for o in ztunnel({"imagePullSecrets": ["regcred"]}) if o["kind"] == "ServiceAccount"]
    assert sa["imagePullSecrets"] == [{"name": "regcred"}]
    # What the docs say is what the schema takes.
    values = (CHART / "values.yaml").read_text()
    readme = (CHART / "README.md").read_text()
    assert "[regcred]" in values and "[{name: regcred}]" in values
    assert "`[regcred]`" in readme and "`[{name: regcred}]`" in readme


# --- the runbook ------------------------------------------------------------------------------------------------------

RUNBOOK_VARS = {"WEFT_IMAGE": "registry.example/mesh/weft", "WEFT_DIGEST": "sha256:" + "ab" * 32, "ZTUNNEL_VERSION": "1.0.0"}
KEEP = "helm.sh/resource-policy"


def runbook() -> dict[str, list[list[str]]]:
    """The README's migration section: each bold-titled step's shell commands, variables substituted."""
    text = (CHART / "README.md").read_text()
    section = text.split("## Migrating from ztunnel", 1)[1].split("\n## ", 1)[0]
    steps: dict[str, list[list[str]]] = {}
    title = ""
    for part in re.split(r"(\*\*[^*]+\*\*|```sh\n.*?```)", section, flags=re.S):
        if part.startswith("**") and re.match(r"\*\*(Before you start|\d+\.|Rollback)", part):
            title = part.strip("*").rstrip(".:")
        elif part.startswith("```sh"):
            body = part.removeprefix("```sh\n").removesuffix("```").replace("\\\n", " ")
            for k, v in RUNBOOK_VARS.items():
                body = body.replace(f'"${k}"', v)
            steps.setdefault(title, []).extend(shlex.split(line, comments=True) for line in body.splitlines() if line.strip())
    return steps


def set_value(values: dict, path: str, raw: str):
    *parents, leaf = path.split(".")
    for p in parents:
        values = values.setdefault(p, {})
    values[leaf] = {"true": True, "false": False}.get(raw, raw)


class Cluster:
    """A model of what Helm does to a namespace's objects, enough to check the runbook's ownership moves: objects
    with their live annotations and labels, and each release's stored manifest. Helm (pkg/action, pkg/kube): a
    release may create an object that exists only if the object's `meta.helm.sh/release-name`/`-namespace`
    annotations and `app.kubernetes.io/managed-by: Helm` label say it is the release's (adoption); an upgrade deletes
    what left the manifest unless the live object says `helm.sh/resource-policy: keep`; an uninstall deletes all of the
    stored manifest except what the manifest itself marks keep."""

    def __init__(self, render, ztunnel_render):
        self.charts = {"charts/weft": lambda v: render(v).objects, "istio/ztunnel": ztunnel_render}
        self.live: dict[tuple, dict[str, dict[str, str]]] = {}
        self.releases: dict[str, tuple[str, dict, list[dict]]] = {}
        self.saved_values: dict[str, dict] = {}

    def apply(self, release: str, chart: str, values: dict, install: bool):
        objects = self.charts[chart](values)
        for o in objects:
            k = keys([o]).pop()
            meta = self.live.get(k)
            if meta is not None and k not in {keys([x]).pop() for x in self.releases.get(release, ("", {}, []))[2]}:
                owner = (meta["annotations"].get("meta.helm.sh/release-name"), meta["annotations"].get("meta.helm.sh/release-namespace"),
                         meta["labels"].get("app.kubernetes.io/managed-by"))
                assert owner == (release, NAMESPACE, "Helm"), f"helm: {k} exists and cannot be imported into {release}: {owner}"
            meta = self.live.setdefault(k, {"annotations": {}, "labels": {}})
            meta["annotations"].update(o["metadata"].get("annotations") or {})
            meta["annotations"].update({"meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": NAMESPACE})
            meta["labels"].update(o["metadata"].get("labels") or {})
            meta["labels"]["app.kubernetes.io/managed-by"] = "Helm"
        if not install:
            gone = keys(self.releases[release][2]) - keys(objects)
            for k in gone:
                if self.live.get(k, {}).get("annotations", {}).get(KEEP) != "keep":
                    self.live.pop(k, None)
        self.releases[release] = (chart, values, objects)

    def run(self, argv: list[str]):
        if argv[:2] == ["helm", "-n"] and "get" in argv:
            self.saved_values[argv[-1]] = copy.deepcopy(self.releases[argv[argv.index("values") + 1]][1])
        elif argv[0] == "helm" and argv[1] in ("install", "upgrade"):
            release, chart = argv[2], argv[3]
            assert "-n" in argv and argv[argv.index("-n") + 1] == NAMESPACE
            values = copy.deepcopy(self.releases[release][1]) if "--reuse-values" in argv else {}
            if "-f" in argv:
                values = copy.deepcopy(self.saved_values[argv[argv.index("-f") + 1]])
            for i, a in enumerate(argv):
                if a == "--set":
                    set_value(values, *argv[i + 1].split("=", 1))
            assert (argv[1] == "install") == (release not in self.releases), argv
            self.apply(release, chart, values, install=argv[1] == "install")
        elif argv[:2] == ["helm", "uninstall"]:
            _, _, objects = self.releases.pop(argv[2])
            for o in objects:
                if (o["metadata"].get("annotations") or {}).get(KEEP) != "keep":
                    self.live.pop(keys([o]).pop(), None)
        elif argv[0] == "kubectl" and argv[3] in ("annotate", "label"):
            k = ({"serviceaccount": "ServiceAccount"}[argv[4]], argv[2], argv[5])
            field = self.live[k]["annotations" if argv[3] == "annotate" else "labels"]
            for a in argv[6:]:
                if a.startswith("--"):
                    continue
                if a.endswith("-"):
                    field.pop(a[:-1], None)
                else:
                    name, value = a.split("=", 1)
                    assert "--overwrite" in argv or field.get(name, value) == value, f"kubectl: {name} is already set"
                    field[name] = value
        elif argv[0] == "kubectl" and argv[3] == "rollout":
            assert ("DaemonSet", argv[2], argv[-1].split("/")[1]) in self.live, argv
        else:
            raise AssertionError(f"the model does not know {argv}")
        self.check()

    def proxies(self) -> dict[str, str]:
        """Each node proxy DaemonSet's release, and the ServiceAccount it runs as."""
        out = {}
        for release, (_, _, objects) in self.releases.items():
            for o in objects:
                if o["kind"] == "DaemonSet" and ("DaemonSet", NAMESPACE, o["metadata"]["name"]) in self.live:
                    out[release] = o["spec"]["template"]["spec"]["serviceAccountName"]
        return out

    def check(self):
        proxies = self.proxies()
        assert proxies, "no node proxy left running"
        for release, account in proxies.items():
            assert ("ServiceAccount", NAMESPACE, account) in self.live, f"{release} runs as {account}, which is gone"
        owned = [k for _, _, objects in self.releases.values() for k in keys(objects)]
        assert len(owned) == len(set(owned)), f"an object in two releases: {owned}"


@pytest.fixture
def cluster(render, ztunnel):
    """Istio's ztunnel installed as the README assumes (release ztunnel in istio-system, default values)."""
    c = Cluster(render, ztunnel)
    c.run(["helm", "install", "ztunnel", "istio/ztunnel", "-n", NAMESPACE])
    return c


def test_the_runbook_has_the_steps_the_tests_play():
    steps = runbook()
    assert list(steps) == [
        "Before you start", "1. Install weft beside ztunnel", "2. Remove ztunnel, keeping its ServiceAccount",
        "3. Let weft's release own the ServiceAccount", "Rollback during step 1", "Rollback after step 3",
    ], list(steps)


def test_runbook_migrates_with_a_node_proxy_and_its_account_throughout(cluster):
    steps = runbook()
    for title in ["Before you start", "1. Install weft beside ztunnel"]:
        for argv in steps[title]:
            cluster.run(argv)
    assert cluster.proxies() == {"ztunnel": "ztunnel", "weft": "ztunnel"}
    before = copy.deepcopy(cluster.releases["weft"][2])
    for title in ["2. Remove ztunnel, keeping its ServiceAccount", "3. Let weft's release own the ServiceAccount"]:
        for argv in steps[title]:
            cluster.run(argv)
    assert cluster.proxies() == {"weft": "ztunnel"}
    assert set(cluster.releases) == {"weft"}
    sa = cluster.live[("ServiceAccount", NAMESPACE, "ztunnel")]
    assert sa["annotations"]["meta.helm.sh/release-name"] == "weft" and KEEP not in sa["annotations"]
    assert ("ServiceAccount", NAMESPACE, "ztunnel") in keys(cluster.releases["weft"][2])
    # Step 3 changed no pod: the node proxies are not restarted.
    assert pod_template(cluster.releases["weft"][2]) == pod_template(before)
    # The same state as a fresh install.
    assert keys(cluster.releases["weft"][2]) == keys(cluster.charts["charts/weft"]({
        "image": {"repository": RUNBOOK_VARS["WEFT_IMAGE"], "digest": RUNBOOK_VARS["WEFT_DIGEST"]}, "ztunnelLabels": True}))


def test_runbook_rollback_during_step_1(cluster):
    steps = runbook()
    for title in ["Before you start", "1. Install weft beside ztunnel", "Rollback during step 1"]:
        for argv in steps[title]:
            cluster.run(argv)
    assert cluster.proxies() == {"ztunnel": "ztunnel"}
    assert cluster.live[("ServiceAccount", NAMESPACE, "ztunnel")]["annotations"]["meta.helm.sh/release-name"] == "ztunnel"


def test_runbook_rollback_after_step_3(cluster):
    steps = runbook()
    for title in ["Before you start", "1. Install weft beside ztunnel", "2. Remove ztunnel, keeping its ServiceAccount",
                  "3. Let weft's release own the ServiceAccount", "Rollback after step 3"]:
        for argv in steps[title]:
            cluster.run(argv)
    assert cluster.proxies() == {"ztunnel": "ztunnel"}
    assert set(cluster.releases) == {"ztunnel"}
    assert cluster.releases["ztunnel"][1] == {}, "reinstalled with the values saved before"
    sa = cluster.live[("ServiceAccount", NAMESPACE, "ztunnel")]
    assert sa["annotations"]["meta.helm.sh/release-name"] == "ztunnel" and KEEP not in sa["annotations"]


def test_runbook_rollback_between_steps_2_and_3(cluster):
    steps = runbook()
    for title in ["Before you start", "1. Install weft beside ztunnel", "2. Remove ztunnel, keeping its ServiceAccount"]:
        for argv in steps[title]:
            cluster.run(argv)
    assert set(cluster.releases) == {"weft"} and ("ServiceAccount", NAMESPACE, "ztunnel") not in keys(cluster.releases["weft"][2])
    for argv in steps["Rollback after step 3"][2:]:
        cluster.run(argv)
    assert cluster.proxies() == {"ztunnel": "ztunnel"} and set(cluster.releases) == {"ztunnel"}


def test_the_model_catches_a_runbook_without_the_keep_annotation(cluster):
    """Step 2 without its first command: the ServiceAccount weft runs as goes with ztunnel's upgrade."""
    steps = runbook()
    for title in ["Before you start", "1. Install weft beside ztunnel"]:
        for argv in steps[title]:
            cluster.run(argv)
    with pytest.raises(AssertionError, match="runs as ztunnel, which is gone"):
        for argv in steps["2. Remove ztunnel, keeping its ServiceAccount"][1:]:
            cluster.run(argv)


def test_the_model_catches_an_install_beside_ztunnel_without_migration_mode(cluster):
    with pytest.raises(AssertionError, match="cannot be imported into weft"):
        cluster.run(["helm", "install", "weft", "charts/weft", "-n", NAMESPACE])
