"""values.schema.json refuses bad values before anything renders, and says where; good values pass."""

from __future__ import annotations

import helm_python as helm
import pytest

from conftest import values_yaml
from variants import VARIANTS

BAD = {
    "unknown top-level key": ({"replicas": 3}, "additional properties 'replicas'"),
    "unknown nested key": ({"image": {"name": "weft"}}, "/image"),
    "mode": ({"mode": "sidecar"}, "/mode"),
    "mark not a number": ({"mark": "0x"}, "/mark"),
    "mark in scientific notation": ({"mark": "1.048576e+06"}, "/mark"),
    "mark over 32 bits": ({"mark": 4294967296}, "/mark"),
    "mark negative": ({"mark": -1}, "/mark"),
    "mark fraction": ({"mark": 1.5}, "/mark"),
    "digest not sha256": ({"image": {"repository": "weft", "pullPolicy": "Always", "digest": "latest"}}, "/image/digest"),
    "pull policy": ({"image": {"repository": "weft", "pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    "grace period too short for a drain": ({"terminationGracePeriodSeconds": 2}, "/terminationGracePeriodSeconds"),
    "grace period as a string": ({"terminationGracePeriodSeconds": "30s"}, "/terminationGracePeriodSeconds"),
    "worker threads zero": ({"workerThreads": 0}, "/workerThreads"),
    "worker threads a word but auto": ({"workerThreads": "all"}, "/workerThreads"),
    "shards negative": ({"shards": -1}, "/shards"),
    "shards a word but auto": ({"shards": "many"}, "/shards"),
    "log format": ({"logFormat": "xml"}, "/logFormat"),
    "CA address without a port": ({"istio": {"caAddress": "istiod.istio-system.svc"}}, "/istio/caAddress"),
    "CA address with words": ({"istio": {"caAddress": "not an address"}}, "/istio/caAddress"),
    "CA address with another scheme": ({"istio": {"caAddress": "grpc://istiod:15012"}}, "/istio/caAddress"),
    "xDS address with a path": ({"istio": {"xdsAddress": "istiod.istio-system.svc:15012/x"}}, "/istio/xdsAddress"),
    "xDS address port too long": ({"istio": {"xdsAddress": "istiod:150120"}}, "/istio/xdsAddress"),
    "plugin xDS address garbage": ({"plugins": {"xds": {"address": "weft-control"}}}, "/plugins/xds/address"),
    "trust bundle name with a slash": ({"istio": {"clusterTrustBundle": "istio.io/istiod-ca"}}, "/istio/clusterTrustBundle"),
    "migration flag not a boolean": ({"migration": {"fromZtunnel": "yes"}}, "/migration/fromZtunnel"),
    "migration unknown key": ({"migration": {"fromZtunnel": True, "keepZtunnel": True}}, "/migration"),
    "ztunnelLabels not a boolean": ({"ztunnelLabels": "app=ztunnel"}, "/ztunnelLabels"),
    "network with a space": ({"network": "net 1"}, "/network"),
    "seLinuxOptions unknown key": ({"seLinuxOptions": {"kind": "spc_t"}}, "/seLinuxOptions"),
    "seLinuxOptions empty type": ({"seLinuxOptions": {"type": ""}}, "/seLinuxOptions/type"),
    "token lifetime under 10 min": ({"istio": {"tokenExpirationSeconds": 60}}, "/istio/tokenExpirationSeconds"),
    "trial without a node": ({"trial": {"enabled": True, "caSecretName": "ca"}}, "/trial"),
    "trial without a CA secret": ({"trial": {"enabled": True, "node": "n1"}}, "/trial"),
    "trial with a control plane": (
        {
            "trial": {"enabled": True, "node": "n1", "caSecretName": "ca"},
            "control": {"enabled": True, "tls": {"secretName": "t"}},
        },
        "/control/enabled",
    ),
    "no node left serving during a rollout": (
        {"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 0}}},
        "/updateStrategy",
    ),
    "update strategy type": ({"updateStrategy": {"type": "Recreate"}}, "/updateStrategy"),
    "plugin without a kind": ({"plugins": {"configMap": "p", "local": [{"name": "a", "path": "a.wasm"}]}}, "/plugins/local/0"),
    "plugin with path and inline": (
        {"plugins": {"configMap": "p", "local": [{"name": "a", "kind": "policy", "path": "a.wasm", "inline": "AA=="}]}},
        "/plugins/local/0",
    ),
    "plugin sha256 too short": (
        {"plugins": {"configMap": "p", "local": [{"name": "a", "kind": "policy", "path": "a", "sha256": "abc"}]}},
        "/plugins/local/0/sha256",
    ),
    "relative plugin path without its ConfigMap": (
        {"plugins": {"local": [{"name": "a", "kind": "policy", "path": "a.wasm"}]}},
        "/plugins/configMap",
    ),
    "service account without a name": ({"serviceAccount": {"create": True, "name": ""}}, "/serviceAccount/name"),
    "env name": ({"env": {"1BAD": "x"}}, "'1BAD'"),
    "env value a map": ({"env": {"X": {"a": 1}}}, "/env/X"),
    "pod label value too long": ({"podLabels": {"a": "x" * 64}}, "/podLabels/a"),
    "toleration operator": ({"tolerations": [{"operator": "Maybe"}]}, "/tolerations/0/operator"),
    "resources with a bad quantity": ({"resources": {"requests": {"memory": "lots"}}}, "/resources/requests/memory"),
    "control plane from a ConfigMap without one": (
        {"control": {"enabled": True, "plugins": {"source": "configMap"}, "tls": {"secretName": "t"}}},
        "/control/pluginsConfigMap",
    ),
    # weft-control takes one source: an upgrade that kept pluginsConfigMap would otherwise drop its plugins silently.
    "control plane from the CRD with a ConfigMap of files too": (
        {"control": {"enabled": True, "pluginsConfigMap": "p", "tls": {"secretName": "t"}}},
        "/control/pluginsConfigMap",
    ),
    "control plane without its TLS Secret": (
        {"control": {"enabled": True}},
        "/control/tls",
    ),
    "control plugin source": ({"control": {"plugins": {"source": "files"}}}, "/control/plugins/source"),
    "control root namespace empty": ({"control": {"plugins": {"rootNamespace": ""}}}, "/control/plugins/rootNamespace"),
    "control root namespace not a name": (
        {"control": {"plugins": {"rootNamespace": "Istio_System"}}},
        "/control/plugins/rootNamespace",
    ),
    "pull secret namespaces as one string": (
        {"control": {"plugins": {"pullSecretNamespaces": "shop"}}},
        "/control/plugins/pullSecretNamespaces",
    ),
    "pull secret namespace not a name": (
        {"control": {"plugins": {"pullSecretNamespaces": ["shop/a"]}}},
        "/control/plugins/pullSecretNamespaces/0",
    ),
    "pull secret namespaces repeated": (
        {"control": {"plugins": {"pullSecretNamespaces": ["shop", "shop"]}}},
        "/control/plugins/pullSecretNamespaces",
    ),
    "control plugins unknown key": ({"control": {"plugins": {"dir": "/x"}}}, "/control/plugins"),
    "disruption budget unknown key": (
        {"control": {"podDisruptionBudget": {"minAvailable": 2}}},
        "/control/podDisruptionBudget",
    ),
    "control port": ({"control": {"port": 70000}}, "/control/port"),
    "podmonitor interval": ({"metrics": {"podMonitor": {"interval": "often"}}}, "/metrics/podMonitor/interval"),
    "imagePullSecrets object without a name": ({"imagePullSecrets": [{"secret": "regcred"}]}, "/imagePullSecrets/0"),
    "imagePullSecrets empty name": ({"imagePullSecrets": [""]}, "/imagePullSecrets/0"),
    "imagePullSecrets as one string": ({"imagePullSecrets": "regcred"}, "/imagePullSecrets"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_schema_rejects(chart, render, case):
    values, where = BAD[case]
    with pytest.raises(helm.HelmValuesError) as err:
        chart.validate_schema(values)
    assert where in str(err.value), str(err.value)
    # Rendering (what install and upgrade do) refuses the same values.
    with pytest.raises(helm.HelmError):
        render(values)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_schema_accepts_the_variants(chart, variant):
    chart.validate_schema(VARIANTS[variant])


def test_schema_accepts_numbers_as_a_values_file_writes_them(chart):
    chart.validate_schema(values_yaml("mark: 0x100000\nterminationGracePeriodSeconds: 60\nworkerThreads: 4\n"))
    chart.validate_schema(values_yaml("mark: '0x100000'\n"))
    chart.validate_schema(values_yaml("workerThreads: auto\n"))


@pytest.mark.parametrize(
    "address",
    [
        "istiod.istio-system.svc:15012",  # ztunnel's chart's default form (manifests/charts/ztunnel/templates/daemonset.yaml)
        "istiod-canary.istio-system.svc:15012",
        "10.96.0.10:15012",
        "[fd00::10]:15012",
        "https://istiod.istio-system.svc:15012",
        "https://istiod.istio-system.svc",
    ],
)
def test_schema_accepts_ztunnels_address_forms(chart, address):
    chart.validate_schema({"istio": {"caAddress": address, "xdsAddress": address}, "plugins": {"xds": {"address": address}}})


def test_schema_accepts_both_pull_secret_forms(chart):
    chart.validate_schema({"imagePullSecrets": ["regcred"]})
    chart.validate_schema({"imagePullSecrets": [{"name": "regcred"}]})
    chart.validate_schema({"imagePullSecrets": ["a", {"name": "b"}]})
