"""Every variant renders with real Helm, passes `helm lint --strict`, and every object it renders passes
kubernetes-validate --strict (unknown fields refused) against Kubernetes 1.30 and the newest schemas it ships."""

from __future__ import annotations

import re

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from conftest import CHART, NAMESPACE
from variants import VARIANTS

KUBE_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
# Custom resources kubernetes-validate ships no schema for; test_chart_values checks them field by field.
CRD_KINDS = {("monitoring.coreos.com/v1", "PodMonitor")}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_helm_lint_strict(variant):
    report = helm.lint(CHART, VARIANTS[variant], strict=True, namespace=NAMESPACE, kube_version="v1.30.0")
    assert report["total_charts_linted"] == 1
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert not problems, problems


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_objects_validate_strict(render, variant, kube):
    rendered = render(VARIANTS[variant])
    assert rendered.objects, "nothing rendered"
    for obj in rendered.objects:
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            continue
        kubernetes_validate.validate(obj, kube, strict=True)


def test_the_newest_schemas_are_newer_than_1_30():
    assert tuple(int(x) for x in KUBE_VERSIONS[1].split(".")[:2]) > (1, 30)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_no_number_in_scientific_notation(render, variant):
    # A float64 of 1e6 or more printed by a template comes out as 1.048576e+06; no flag parser takes that.
    for path, text in render(VARIANTS[variant]).text.items():
        assert not re.search(r"\d\.?\d*e[+-]\d\d", text), f"{path} has a number in scientific notation:\n{text}"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_object_is_namespaced_to_the_release_or_cluster_scoped(render, variant):
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding"}
    # The one exception: weft-control's Roles for reading pull Secrets in the namespaces the operator lists.
    elsewhere = set(VARIANTS[variant].get("control", {}).get("plugins", {}).get("pullSecretNamespaces", []))
    for obj in render(VARIANTS[variant]).objects:
        if obj["kind"] in cluster_scoped:
            assert "namespace" not in obj["metadata"]
        elif obj["kind"] in {"Role", "RoleBinding"} and obj["metadata"]["namespace"] in elsewhere:
            assert obj["metadata"]["name"].endswith("-pull-secrets"), obj["metadata"]
        else:
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]


def test_rendered_yaml_has_no_duplicate_keys(render):
    # PyYAML keeps the last of duplicate keys silently; the API server refuses them. Load with a strict loader.
    class Strict(yaml.SafeLoader):
        pass

    def mapping(loader, node, deep=False):
        keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
        dup = {k for k in keys if keys.count(k) > 1}
        assert not dup, f"duplicate keys {dup} at line {node.start_mark.line + 1}"
        return yaml.SafeLoader.construct_mapping(loader, node, deep)

    Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    for variant in VARIANTS.values():
        for path, text in render(variant).text.items():
            if not path.endswith("NOTES.txt"):
                list(yaml.load_all(text, Loader=Strict))
