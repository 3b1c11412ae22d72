"""What each value does to the rendered objects: the cluster default, trial mode, plugins, PodMonitor, service
accounts, names, numbers."""
from __future__ import annotations

from pathlib import Path

import helm_python as helm
import pytest
import yaml

from conftest import CHART, NAMESPACE, values_yaml
from variants import TRIAL_MESH, VARIANTS


def args_of(container) -> dict[str, str]:
    out = {}
    for a in container["args"][1:]:
        assert a.startswith("--") and "=" in a, a
        k, v = a[2:].split("=", 1)
        assert k not in out, f"--{k} given twice"
        out[k] = v
    return out


def env_of(container) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def volumes_of(ds) -> dict[str, dict]:
    return {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}


def mounts_of(container) -> dict[str, str]:
    return {m["mountPath"]: m["name"] for m in container["volumeMounts"]}


def test_default_is_the_cluster_mode(render):
    r = render()
    assert r.kinds() == ["DaemonSet", "ServiceAccount"]
    ds = r.daemonset()
    pod = ds["spec"]["template"]["spec"]
    c = r.container()
    assert c["args"][0] == "run"
    args = args_of(c)
    assert args["mode"] == "inpod"
    assert args["inpod-uds"] == "/var/run/ztunnel/ztunnel.sock"
    assert args["ca-kind"] == "istio"
    assert "ca-dir" not in args and "config" not in args
    env = env_of(c)
    assert env["CA_ADDRESS"] == env["XDS_ADDRESS"] == "https://istiod.istio-system.svc:15012"
    assert env["CLUSTER_ID"] == "Kubernetes"
    # The Istio release reported to istiod: the image's and the binary's default (runtime/node/weft/src/xds.rs).
    xds_rs = (Path(__file__).resolve().parents[2] / "runtime/node/weft/src/xds.rs").read_text()
    assert f'pub const ISTIO_VERSION: &str = "{env["ISTIO_META_ISTIO_VERSION"]}";' in xds_rs
    dockerfile = (Path(__file__).resolve().parents[2] / "Dockerfile").read_text()
    assert f'ARG ISTIO_VERSION={env["ISTIO_META_ISTIO_VERSION"]}' in dockerfile
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["INSTANCE_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}

    vols = volumes_of(ds)
    mounts = mounts_of(c)
    # istio-cni's socket directory, the mesh root from istiod's ConfigMap, the projected istio-ca token.
    assert vols["cni-socket"]["hostPath"] == {"path": "/var/run/ztunnel", "type": "DirectoryOrCreate"}
    assert mounts["/var/run/ztunnel"] == "cni-socket"
    assert vols["istio-root-cert"]["configMap"]["name"] == "istio-ca-root-cert"
    assert args["ca-root-cert"] == args["xds-root-cert"] == "/var/run/secrets/istio/root-cert.pem"
    assert mounts["/var/run/secrets/istio"] == "istio-root-cert"
    (token,) = vols["istio-token"]["projected"]["sources"]
    assert token["serviceAccountToken"]["audience"] == "istio-ca"
    assert token["serviceAccountToken"]["path"] == "istio-token"
    assert args["ca-token-file"] == args["xds-token-file"] == "/var/run/secrets/tokens/istio-token"
    assert mounts["/var/run/secrets/tokens"] == "istio-token"
    # No root key anywhere on a node in cluster mode.
    assert not any("secret" in v for v in vols.values())
    assert pod["automountServiceAccountToken"] is False

    # istiod trusts istio-system/ztunnel as a node agent by default.
    assert pod["serviceAccountName"] == "ztunnel"
    assert r.one("ServiceAccount")["metadata"]["name"] == "ztunnel"


def test_default_security_context(render):
    r = render()
    pod = r.daemonset()["spec"]["template"]["spec"]
    sc = r.container()["securityContext"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN", "SYS_ADMIN"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["privileged"] is False
    assert sc["runAsUser"] == 0
    # What weft writes goes to emptyDirs: /tmp and the plugin caches.
    c = r.container()
    vols = volumes_of(r.daemonset())
    mounts = mounts_of(c)
    assert vols[mounts["/tmp"]]["emptyDir"] == {}
    assert vols[mounts["/var/lib/weft"]]["emptyDir"] == {}
    assert args_of(c)["plugin-cache"].startswith("/var/lib/weft/")


def test_node_mode_needs_no_sys_admin(render):
    r = render({"mode": "node"})
    sc = r.container()["securityContext"]
    assert sc["capabilities"]["add"] == ["NET_ADMIN"]
    assert sc["allowPrivilegeEscalation"] is False
    pod = r.daemonset()["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert "cni-socket" not in volumes_of(r.daemonset())
    assert "inpod-uds" not in args_of(r.container())


def test_default_scheduling_and_rollout(render):
    r = render()
    ds = r.daemonset()
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert {"operator": "Exists", "effect": "NoExecute"} in pod["tolerations"]
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    # No memory limit (an OOM kill drops every connection on the node), requests set.
    res = r.container()["resources"]
    assert "limits" not in res
    assert res["requests"] == {"cpu": "200m", "memory": "512Mi"}
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert labels["sidecar.istio.io/inject"] == "false"
    assert labels["istio.io/dataplane-mode"] == "none"
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "15020"
    assert annotations["prometheus.io/path"] == "/stats/prometheus"
    probe = r.container()["readinessProbe"]["httpGet"]
    assert (probe["port"], probe["path"]) == (15021, "/healthz/ready")


def test_one_value_sets_grace_period_and_drain_deadline(render):
    for grace, drain in [(30, "28s"), (120, "118s"), (5, "3s")]:
        r = render({"terminationGracePeriodSeconds": grace})
        assert r.daemonset()["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == grace
        assert args_of(r.container())["drain-deadline"] == drain


def test_worker_threads_auto_by_default_or_a_number(render):
    assert args_of(render().container())["worker-threads"] == "auto"
    assert args_of(render(values_yaml("workerThreads: 4\n")).container())["worker-threads"] == "4"
    assert args_of(render({"workerThreads": "auto"}).container())["worker-threads"] == "auto"


def test_shards_auto_by_default_or_a_number_zero_included(render):
    assert args_of(render().container())["shards"] == "auto"
    assert args_of(render(values_yaml("shards: 4\n")).container())["shards"] == "4"
    assert args_of(render({"shards": 0}).container())["shards"] == "0"


def test_mark_in_hex_is_not_scientific_notation(render):
    # The bug: `mark: 0x100000` in a values file reached weft as --mark=1.048576e+06 and weft refused to start.
    r = render(values_yaml("mark: 0x100000\nmaxConnectionsPerListener: 1000000\nistio:\n  tokenExpirationSeconds: 86400000\n"))
    args = args_of(r.container())
    assert args["mark"] == "0x100000"
    assert args["max-connections-per-listener"] == "1000000"
    token = volumes_of(r.daemonset())["istio-token"]["projected"]["sources"][0]["serviceAccountToken"]
    assert token["expirationSeconds"] == 86400000
    # Strings pass as written; the chart's own default (0x539, read by YAML as 1337) comes back as hex.
    assert args_of(render({"mark": "1337"}).container())["mark"] == "1337"
    assert args_of(render({"mark": "0xFFFFFFFF"}).container())["mark"] == "0xFFFFFFFF"
    assert args_of(render().container())["mark"] == "0x539"
    assert args_of(render(values_yaml("mark: 4294967295\n")).container())["mark"] == "0xffffffff"


def test_env_values_keep_integers(render):
    r = render(values_yaml("env:\n  BIG: 1048576\n  FLAG: true\n  TEXT: hello\n  FRACTION: 0.5\n"))
    env = env_of(r.container())
    assert (env["BIG"], env["FLAG"], env["TEXT"], env["FRACTION"]) == ("1048576", "true", "hello", "0.5")


def test_trial_mode_pins_the_root_key_to_one_node(render):
    r = render(VARIANTS["trial-local-ca"])
    ds = r.daemonset()
    pod = ds["spec"]["template"]["spec"]
    c = r.container()
    args = args_of(c)
    assert args["ca-kind"] == "local"
    assert args["ca-dir"] == "/etc/weft/ca"
    assert args["config"] == "/etc/weft/config/config.yaml"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux", "kubernetes.io/hostname": "kind-control-plane"}
    vols = volumes_of(ds)
    assert vols["trial-ca"]["secret"] == {"secretName": "weft-trial-ca", "defaultMode": 0o400}
    assert "istio-token" not in vols and "CA_ADDRESS" not in env_of(c) and "XDS_ADDRESS" not in env_of(c)
    assert not any(k.startswith("xds-") for k in args)
    # The mesh file reaches weft as written (Helm would have quoted the integer port keys, which weft refuses).
    cm = r.one("ConfigMap", "weft-config")
    assert cm["data"]["config.yaml"] == TRIAL_MESH
    assert yaml.safe_load(cm["data"]["config.yaml"])["services"][0]["ports"] == {80: 8080}
    assert "WARNING: TRIAL MODE" in r.notes and "kind-control-plane" in r.notes


def test_trial_mesh_and_local_plugins_share_the_file(render):
    values = {**VARIANTS["trial-local-ca"], "plugins": VARIANTS["plugins-from-configmap"]["plugins"]}
    cfg = yaml.safe_load(render(values).one("ConfigMap", "weft-config")["data"]["config.yaml"])
    assert set(cfg) == {"workloads", "services", "policies", "plugins"}
    assert cfg["plugins"][0]["path"] == "/etc/weft/plugins/port_allowlist.wasm"
    # Both places naming plugins is refused, not merged by guess.
    values["trial"] = {**values["trial"], "mesh": TRIAL_MESH + "plugins: []\n"}
    with pytest.raises(helm.HelmError, match="put the plugins there or in plugins.local"):
        render(values)


def test_plugins_from_a_configmap(render):
    r = render(VARIANTS["plugins-from-configmap"])
    ds = r.daemonset()
    c = r.container()
    assert args_of(c)["config"] == "/etc/weft/config/config.yaml"
    assert volumes_of(ds)["plugins"]["configMap"]["name"] == "my-plugins"
    assert mounts_of(c)["/etc/weft/plugins"] == "plugins"
    cfg = yaml.safe_load(r.one("ConfigMap", "weft-config")["data"]["config.yaml"])
    assert set(cfg) == {"plugins"}, "cluster mode: the file carries plugins only, the mesh comes from istiod"
    (p,) = cfg["plugins"]
    assert p["path"] == "/etc/weft/plugins/port_allowlist.wasm"
    assert p["config"] == {"ports": [8080, "9000-9099"], "deny_message": "port not allowed"}
    assert p["sha256"] == "0" * 64
    # Numbers in a plugin's config stay integers, however large.
    local = [{"name": "n", "kind": "telemetry", "path": "n.wasm", "config": {"maxBytes": 1048576, "big": 10**15}}]
    r = render({"plugins": {"configMap": "my-plugins", "local": local}})
    cfg = yaml.safe_load(r.one("ConfigMap", "weft-config")["data"]["config.yaml"])
    assert cfg["plugins"][0]["config"] == {"maxBytes": 1048576, "big": 10**15}
    # An absolute path is left alone.
    r = render({"plugins": {"local": [{"name": "x", "kind": "telemetry", "path": "/opt/x.wasm"}]}})
    cfg = yaml.safe_load(r.one("ConfigMap", "weft-config")["data"]["config.yaml"])
    assert cfg["plugins"][0]["path"] == "/opt/x.wasm"


def test_podmonitor_selects_the_pods_and_their_metrics_port(render):
    r = render(VARIANTS["podmonitor"])
    pm = r.one("PodMonitor")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["metadata"]["labels"]["release"] == "prometheus"
    assert set(pm["spec"]) == {"selector", "podMetricsEndpoints"}
    selector = pm["spec"]["selector"]["matchLabels"]
    pod_labels = r.daemonset()["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert set(ep) == {"port", "path", "interval"}
    assert ep["path"] == "/stats/prometheus" and ep["interval"] == "15s"
    ports = {p["name"]: p["containerPort"] for p in r.container()["ports"]}
    assert ports[ep["port"]] == 15020
    # Without it, no PodMonitor (the CRD may not exist).
    assert "PodMonitor" not in render().kinds()


def test_custom_service_account(render):
    r = render(VARIANTS["custom-service-account"])
    sa = r.one("ServiceAccount")
    assert sa["metadata"]["name"] == "weft-node"
    assert sa["metadata"]["annotations"] == {"a": "b"}
    assert r.daemonset()["spec"]["template"]["spec"]["serviceAccountName"] == "weft-node"
    assert "CA_TRUSTED_NODE_ACCOUNTS" in r.notes and "istio-system/weft-node" in r.notes
    # Reusing an existing account: none created.
    r = render({"serviceAccount": {"create": False, "name": "ztunnel"}})
    assert "ServiceAccount" not in r.kinds()
    assert "CA_TRUSTED_NODE_ACCOUNTS" not in r.notes


def test_two_releases_do_not_collide(render):
    def keys(r):
        return {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in r.objects}

    everything = VARIANTS["everything"]
    a = render(everything, name="mesh-a")
    b = render({**everything, "serviceAccount": {"create": False, "name": "ztunnel"}}, name="mesh-b")
    assert not keys(a) & keys(b)
    # The same release name in two namespaces: the cluster-scoped RBAC objects carry the namespace.
    c = render(everything, name="mesh-a", namespace="other")
    cluster = {k for k in keys(a) | keys(c) if k[1] is None}
    assert len(cluster) == 4, cluster
    # Selectors of one release never match the other's pods.
    sel_a = a.daemonset()["spec"]["selector"]["matchLabels"]
    pods_b = b.daemonset()["spec"]["template"]["metadata"]["labels"]
    assert not sel_a.items() <= pods_b.items()


def test_image_by_tag_or_digest(render):
    assert render().container()["image"] == "weft:0.1.0"
    assert render({"image": {"tag": "v2"}}).container()["image"] == "weft:v2"
    digest = "sha256:" + "ab" * 32
    r = render({"image": {"repository": "registry.example/mesh/weft", "tag": "v2", "digest": digest}})
    assert r.container()["image"] == f"registry.example/mesh/weft@{digest}"


def test_istio_revision_and_addresses(render):
    env = env_of(render({"istio": {"revision": "canary", "namespace": "mesh"}}).container())
    assert env["CA_ADDRESS"] == env["XDS_ADDRESS"] == "https://istiod-canary.mesh.svc:15012"
    env = env_of(render({"istio": {"caAddress": "https://ca.example:15012", "xdsAddress": "https://xds.example:15012"}}).container())
    assert (env["CA_ADDRESS"], env["XDS_ADDRESS"]) == ("https://ca.example:15012", "https://xds.example:15012")


def test_control_plane(render):
    r = render(VARIANTS["control-plane"])
    assert {"Deployment", "Service", "ClusterRole", "ClusterRoleBinding"} <= set(r.kinds())
    dep = r.one("Deployment")
    svc = r.one("Service")
    assert dep["metadata"]["name"] == svc["metadata"]["name"] == "weft-control"
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    # The Service does not select the node proxies.
    assert not svc["spec"]["selector"].items() <= r.daemonset()["spec"]["template"]["metadata"]["labels"].items()
    # TokenReviews first; the WeftPlugin controller's rules (crd, the default) are test_chart_controller.py's.
    assert r.one("ClusterRole")["rules"][0] == {
        "apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]
    }
    binding = r.one("ClusterRoleBinding")
    (subject,) = binding["subjects"]
    assert subject == {"kind": "ServiceAccount", "name": "weft-control", "namespace": NAMESPACE}
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "weft-control"
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["/usr/local/bin/weft-control"], "the control plane's own binary"
    args = {a.split("=", 1)[0]: a.partition("=")[2] for a in c["args"]}
    # One credential per audience: weft-control reviews tokens for its own audience, from the node agents only.
    assert args["--audience"] == "weft-control"
    assert args["--node-accounts"] == f"{NAMESPACE}/ztunnel"
    assert args["--kube-api"] == "https://kubernetes.default.svc"
    # Serving key, API server CA and its own token in one projected volume (owned by the pod's user).
    creds = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}["credentials"]["projected"]
    assert creds["defaultMode"] == 0o400
    secret, kube_ca, token = creds["sources"]
    assert secret["secret"]["name"] == "weft-control-tls"
    assert {i["path"] for i in secret["secret"]["items"]} == {"tls.crt", "tls.key"}
    assert kube_ca["configMap"]["name"] == "kube-root-ca.crt"
    assert token["serviceAccountToken"]["path"] == "token" and "audience" not in token["serviceAccountToken"]
    assert dep["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert {"--tls-cert", "--tls-key", "--kube-ca-file", "--kube-token-file"} <= set(args)
    # Scraped on its own path.
    monitors = render({**VARIANTS["control-plane"], "metrics": {"podMonitor": {"enabled": True}}}).objects
    paths = {m["metadata"]["name"]: m["spec"]["podMetricsEndpoints"][0]["path"] for m in monitors if m["kind"] == "PodMonitor"}
    assert paths == {"weft": "/stats/prometheus", "weft-control": "/metrics"}
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert dep["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    # The nodes are pointed at it.
    args = args_of(r.container())
    assert args["plugin-xds-address"] == "https://weft-control.istio-system.svc:15012"
    assert args["plugin-xds-root-cert"] == "/var/run/secrets/istio/root-cert.pem"
    # ... with a token for weft-control's audience alone; istiod keeps getting the istio-ca one.
    assert args["plugin-xds-token-file"] == "/var/run/secrets/tokens/weft-control-token"
    assert args["xds-token-file"] == args["ca-token-file"] == "/var/run/secrets/tokens/istio-token"
    istio, control = volumes_of(r.daemonset())["istio-token"]["projected"]["sources"]
    assert istio["serviceAccountToken"]["audience"] == "istio-ca"
    assert control["serviceAccountToken"] == {
        "path": "weft-control-token",
        "audience": "weft-control",
        "expirationSeconds": istio["serviceAccountToken"]["expirationSeconds"],
    }
    assert mounts_of(r.container())["/var/run/secrets/tokens"] == "istio-token"


def test_every_path_weft_is_given_is_mounted(render):
    # A flag naming a file or directory points into a volume of the pod; what weft writes is on a writable one.
    writes = {"plugin-cache", "plugin-fetch-cache"}
    for name, variant in VARIANTS.items():
        r = render(variant)
        containers = [r.container()]
        if "Deployment" in r.kinds():
            containers += r.one("Deployment")["spec"]["template"]["spec"]["containers"]
        for c in containers:
            mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
            for arg in c["args"][1:]:
                flag, _, value = arg[2:].partition("=")
                if not value.startswith("/"):
                    continue
                under = [m for p, m in mounts.items() if value == p or value.startswith(p.rstrip("/") + "/")]
                assert under, f"{name}: --{flag}={value} is on no volume"
                if flag in writes:
                    assert not under[0].get("readOnly"), f"{name}: --{flag} is on a read-only volume"


def test_a_chart_upgrade_alone_does_not_restart_the_node_proxies(tmp_path):
    # Same values and image, new chart version: the pod templates must be identical, or every node proxy restarts.
    import shutil

    copy = tmp_path / "weft"
    shutil.copytree(CHART, copy)
    meta = (copy / "Chart.yaml").read_text()
    (copy / "Chart.yaml").write_text(meta.replace("\nversion: ", "\nversion: 9.9.9-", 1))

    def templates(path):
        with helm.Chart.load(path) as c:
            out = c.render(values=VARIANTS["everything"], name="weft", namespace=NAMESPACE)
        docs = [d for k, t in out.items() if not k.endswith("NOTES.txt") for d in yaml.safe_load_all(t) if d]
        return {d["kind"]: d["spec"]["template"] for d in docs if d["kind"] in ("DaemonSet", "Deployment")}, docs

    before, docs_before = templates(CHART)
    after, docs_after = templates(copy)
    assert set(before) == {"DaemonSet", "Deployment"}
    assert before == after
    assert docs_before != docs_after, "the chart label did change on the objects themselves"
