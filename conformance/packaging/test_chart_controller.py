"""weft-control as the WeftPlugin controller (control.plugins.source crd, the default): its replicas, disruption
budget, flags and environment, and RBAC granting exactly what the controller does against the API server and no
more; and the ConfigMap source (configMap), which keeps the files and gets none of that RBAC."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from conftest import CHART, NAMESPACE
from variants import VARIANTS

CONTROL = {"enabled": True, "tls": {"secretName": "weft-control-tls"}}
TOKENREVIEWS = {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}
PLUGINS = {"apiGroups": ["weft.dev"], "resources": ["weftplugins"], "verbs": ["get", "list", "watch"]}
STATUS = {"apiGroups": ["weft.dev"], "resources": ["weftplugins/status"], "verbs": ["get", "patch", "update"]}
PODS = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}
SECRETS = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
# In the release's namespace. create, list and watch cannot be limited by resourceNames; the reports' names carry
# the pod's, so neither can get/update/delete of ConfigMaps.
OWN_NAMESPACE = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": ["weft-control-leader"],
        "verbs": ["get", "update"],
    },
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "list", "watch"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "update", "delete"]},
]
SUBJECT = {"kind": "ServiceAccount", "name": "weft-control", "namespace": NAMESPACE}


def control(**extra) -> dict:
    return {"control": {**copy.deepcopy(CONTROL), **extra}}


def container(r):
    (c,) = r.one("Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def rbac(r, kind: str) -> list[dict]:
    return [o for o in r.objects if o["kind"] == kind]


def grants(r) -> list[tuple[str, str | None, dict]]:
    """Every rule reaching weft-control's account: (binding kind, namespace or None, rule)."""
    out = []
    for binding in rbac(r, "ClusterRoleBinding") + rbac(r, "RoleBinding"):
        assert binding["subjects"] == [SUBJECT], binding["subjects"]
        ns = binding["metadata"].get("namespace")
        role = r.one(binding["roleRef"]["kind"], binding["roleRef"]["name"]) if ns is None else [
            o for o in rbac(r, "Role") if o["metadata"]["name"] == binding["roleRef"]["name"] and o["metadata"]["namespace"] == ns
        ][0]
        assert binding["roleRef"]["kind"] == ("ClusterRole" if ns is None else "Role")
        out += [(binding["kind"], ns, rule) for rule in role["rules"]]
    return out


def test_defaults_two_replicas_and_a_disruption_budget(render):
    r = render(control())
    dep = r.one("Deployment")
    assert dep["spec"]["replicas"] == 2
    pdb = r.one("PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["metadata"]["name"] == "weft-control" and pdb["metadata"]["namespace"] == NAMESPACE
    assert pdb["spec"] == {"minAvailable": 1, "selector": dep["spec"]["selector"]}
    # The budget selects the control plane's pods, not the node proxies.
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert not pdb["spec"]["selector"]["matchLabels"].items() <= r.daemonset()["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize(
    "extra",
    [{"replicas": 1}, {"replicas": 0}, {"podDisruptionBudget": {"enabled": False}}],
    ids=["one replica", "none", "turned off"],
)
def test_no_disruption_budget(render, extra):
    r = render(control(**extra))
    assert "PodDisruptionBudget" not in r.kinds()


def test_no_disruption_budget_without_the_control_plane(render):
    assert "PodDisruptionBudget" not in render().kinds()


def test_crd_mode_args_and_env(render):
    c = container(render(control()))
    args = c["args"]
    assert "--plugins-from-kube" in args
    assert "--root-namespace=istio-system" in args
    assert not [a for a in args if a.startswith("--plugins-dir")], "--plugins-from-kube conflicts with --plugins-dir"
    # The same API server and credentials as its TokenReviews.
    assert {"--kube-api=https://kubernetes.default.svc", "--kube-ca-file=/var/run/secrets/weft-control/kube-ca.crt",
            "--kube-token-file=/var/run/secrets/weft-control/token"} <= set(args)
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"] == {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    assert env["POD_NAMESPACE"] == {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
    # No plugin files mounted.
    volumes = {v["name"] for v in render(control()).one("Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert "weft-plugins" not in volumes
    assert "/etc/weft/plugins.d" not in {m["mountPath"] for m in c["volumeMounts"]}


def test_root_namespace_value(render):
    args = container(render(control(plugins={"rootNamespace": "mesh-root"})))["args"]
    assert "--root-namespace=mesh-root" in args and "--root-namespace=istio-system" not in args


def test_crd_mode_rbac_is_exactly_what_the_controller_uses(render):
    r = render(control())
    assert r.one("ClusterRole")["metadata"]["name"] == f"weft-control-{NAMESPACE}"
    assert r.one("ClusterRole")["rules"] == [TOKENREVIEWS, PLUGINS, STATUS, PODS, SECRETS]
    role = r.one("Role")
    assert (role["metadata"]["name"], role["metadata"]["namespace"]) == ("weft-control", NAMESPACE)
    assert role["rules"] == OWN_NAMESPACE
    binding = r.one("RoleBinding")
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "weft-control"}
    assert grants(r) == [("ClusterRoleBinding", None, rule) for rule in [TOKENREVIEWS, PLUGINS, STATUS, PODS, SECRETS]] + [
        ("RoleBinding", NAMESPACE, rule) for rule in OWN_NAMESPACE
    ]


def test_rbac_never_grants_more_than_it_names(render):
    # No wildcard, no escalation verbs, no list/watch of Secrets anywhere, in every variant.
    for name, values in VARIANTS.items():
        r = render(values)
        for _, _, rule in grants(r) if "Deployment" in r.kinds() else []:
            for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(key, []), (name, rule)
            assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule["verbs"]), (name, rule)
            if "patch" in rule["verbs"]:
                assert rule == STATUS, (name, rule)
            if "secrets" in rule["resources"]:
                assert rule["verbs"] == ["get"], (name, rule)


def test_pull_secret_namespaces_replace_the_cluster_wide_secrets_rule(render):
    r = render(control(plugins={"pullSecretNamespaces": ["shop", "payments"]}))
    rules = r.one("ClusterRole")["rules"]
    assert rules == [TOKENREVIEWS, PLUGINS, STATUS, PODS]
    assert not [rule for rule in rules if "secrets" in rule["resources"]]
    name = f"weft-control-{NAMESPACE}-pull-secrets"
    roles = {o["metadata"]["namespace"]: o for o in rbac(r, "Role") if o["metadata"]["name"] == name}
    bindings = {o["metadata"]["namespace"]: o for o in rbac(r, "RoleBinding") if o["metadata"]["name"] == name}
    assert set(roles) == set(bindings) == {"shop", "payments"}
    for ns in ("shop", "payments"):
        assert roles[ns]["rules"] == [SECRETS]
        assert bindings[ns]["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
        assert bindings[ns]["subjects"] == [SUBJECT]
    # The release's own Role is unchanged, and Secrets are reachable in the listed namespaces only.
    assert [o for o in rbac(r, "Role") if o["metadata"]["namespace"] == NAMESPACE][0]["rules"] == OWN_NAMESPACE
    secret_grants = {(kind, ns) for kind, ns, rule in grants(r) if "secrets" in rule["resources"]}
    assert secret_grants == {("RoleBinding", "shop"), ("RoleBinding", "payments")}


def test_pull_secret_roles_of_two_releases_do_not_collide(render):
    values = control(plugins={"pullSecretNamespaces": ["shop"]})
    names = set()
    for ns in ("istio-system", "mesh-two"):
        r = render(values, namespace=ns)
        names |= {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]) for o in r.objects
                  if o["kind"] in ("Role", "RoleBinding") and o["metadata"]["namespace"] == "shop"}
    assert len(names) == 4


def test_configmap_mode_keeps_the_files_and_gets_no_plugin_rbac(render):
    r = render(VARIANTS["control-plane-configmap"])
    c = container(r)
    assert "--plugins-dir=/etc/weft/plugins.d" in c["args"]
    assert not [a for a in c["args"] if a.startswith(("--plugins-from-kube", "--root-namespace"))]
    assert not {"POD_NAME", "POD_NAMESPACE"} & {e["name"] for e in c["env"]}
    assert {m["mountPath"]: m["name"] for m in c["volumeMounts"]}["/etc/weft/plugins.d"] == "weft-plugins"
    volumes = {v["name"]: v for v in r.one("Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["weft-plugins"] == {"name": "weft-plugins", "configMap": {"name": "weft-plugins"}}
    assert r.one("ClusterRole")["rules"] == [TOKENREVIEWS]
    assert "Role" not in r.kinds() and "RoleBinding" not in r.kinds()
    # Even with pull Secret namespaces left set: nothing reads them.
    values = copy.deepcopy(VARIANTS["control-plane-configmap"])
    values["control"]["plugins"]["pullSecretNamespaces"] = ["shop"]
    r = render(values)
    assert r.one("ClusterRole")["rules"] == [TOKENREVIEWS]
    assert "Role" not in r.kinds() and "RoleBinding" not in r.kinds()
    # Replicas and the budget do not depend on the source.
    assert r.one("Deployment")["spec"]["replicas"] == 2 and "PodDisruptionBudget" in r.kinds()


@pytest.mark.parametrize("kube", ["1.30.0", kubernetes_validate.latest_version()])
@pytest.mark.parametrize(
    "values",
    [
        control(),
        control(plugins={"pullSecretNamespaces": ["shop", "payments"], "rootNamespace": "mesh-root"}),
        control(replicas=5, podDisruptionBudget={"enabled": True}),
        control(plugins={"source": "configMap"}, pluginsConfigMap="weft-plugins"),
    ],
    ids=["crd", "crd-scoped", "crd-five", "configMap"],
)
def test_every_object_validates(render, values, kube):
    objects = render(values).objects
    assert "PodDisruptionBudget" in {o["kind"] for o in objects}
    for obj in objects:
        kubernetes_validate.validate(obj, kube, strict=True)


def test_the_crd_no_longer_says_the_controller_is_not_built():
    crd = (CHART / "crds" / "weftplugins.weft.dev.yaml").read_text()
    header = crd[: crd.index("apiVersion:")]
    assert "not built" not in header
    assert "control.plugins.source" in header
