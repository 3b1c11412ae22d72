"""The WeftPlugin CustomResourceDefinition (charts/weft/crds/weftplugins.weft.dev.yaml, issue #45).

- The manifest passes kubernetes-validate --strict as an apiextensions.k8s.io/v1 CustomResourceDefinition (a typo in
  a schema keyword is an unknown field there) against Kubernetes 1.30 and the newest schemas it ships.
- Its schema is structural, as the API server requires of a v1 CRD (every node has a type, no additionalProperties
  beside properties, no uniqueItems, $ref or unions, list types on the right items, metadata left to the server).
- Example resources are checked against its openAPIV3Schema with jsonschema, extended with what the API server
  adds: unknown fields refused (kubectl's strict field validation; the server would otherwise prune them), int32 and
  int64 ranges, date-time strings, x-kubernetes-list-type set and map uniqueness, and the CEL rules of
  x-kubernetes-validations evaluated with cel-python (Google's CEL in Python) on the value each rule is attached to.
  cel-python is standard CEL: Kubernetes' CEL libraries beyond it (isURL, quantity, ...) are not used by these
  rules, and the API server's cost estimate of a rule is not computed here (every string a rule reads has a
  maxLength).
- The chart carries it in crds/, which Helm installs before the templates and does not template: it is not among
  the rendered objects.
- Every WeftPlugin in charts/weft/examples and in a ```yaml block of the repository's Markdown is a valid resource.

Not exercised: a live API server (none can run here), so neither the server's own structural-schema and CEL
compilation checks nor `kubectl explain` / printer columns against real objects.
"""

from __future__ import annotations

import copy
import datetime
import json
import re
from pathlib import Path
from typing import Any, Iterator

import celpy
import jsonschema
import kubernetes_validate
import pytest
import yaml

from conftest import CHART, REPO

KUBE_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
CRD_FILE = CHART / "crds" / "weftplugins.weft.dev.yaml"
EXAMPLES = sorted((CHART / "examples").glob("weftplugin-*.yaml"))

# The short names of Istio's CRDs, from manifests/charts/base/files/crd-all.gen.yaml of istio/istio at commit
# 86c9f01fd735fb01d8192f5bcaf0d424afb7f14c (WasmPlugin, wasmplugins.extensions.istio.io, has none).
ISTIO_SHORT_NAMES = {"dr", "gw", "se", "vs", "we", "wg", "ap", "pa", "ra", "telemetry"}
# Kubernetes' own short names a `kubectl get wp` could be confused with (kubectl api-resources, 1.30).
KUBE_SHORT_NAMES = {
    "cm", "cs", "csr", "ds", "deploy", "ep", "ev", "hpa", "ing", "limits", "netpol", "no", "ns", "pc", "pdb", "po",
    "psp", "pv", "pvc", "quota", "rc", "rs", "sa", "sc", "sts", "svc", "crd", "crds",
}


def load_crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_FILE.read_text())


def openapi_schema() -> dict[str, Any]:
    (version,) = load_crd()["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


# --- (a) the manifest, strictly --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
def test_crd_validates_strict(kube):
    kubernetes_validate.validate(load_crd(), kube, strict=True)


def test_strict_validation_sees_a_typo_in_the_schema():
    # What makes the test above worth having: a misspelt schema keyword is an unknown field of JSONSchemaProps.
    crd = load_crd()
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["url"]["minLenght"] = 1
    with pytest.raises(kubernetes_validate.ValidationError, match="minLenght"):
        kubernetes_validate.validate(crd, KUBE_VERSIONS[0], strict=True)


def test_names_group_and_version():
    crd = load_crd()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{spec['names']['plural']}.{spec['group']}" == "weftplugins.weft.dev"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "WeftPlugin"
    assert spec["names"]["singular"] == "weftplugin"
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    short = set(spec["names"]["shortNames"])
    assert short and not short & ISTIO_SHORT_NAMES and not short & KUBE_SHORT_NAMES


def test_printer_columns():
    (version,) = load_crd()["spec"]["versions"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Kind": ".spec.kind",
        "Phase": ".status.phase",
        "Ready": ".status.readyNodes",
        "Sha256": ".status.servingSha256",
        "Age": ".metadata.creationTimestamp",
    }
    # Every column names a field the schema has.
    schema = openapi_schema()
    for path in columns.values():
        if path.startswith(".metadata."):
            continue
        node = schema
        for part in path.strip(".").split("."):
            node = node["properties"][part]


def test_fields_named_as_istios_wasmplugin():
    spec = openapi_schema()["properties"]["spec"]
    # The fields WasmPlugin has too (extensions.istio.io/v1alpha1, same commit as above), and weft's own.
    istio = {"url", "sha256", "imagePullPolicy", "imagePullSecret", "pluginConfig", "pluginName", "selector",
             "failStrategy", "priority"}
    weft = {"kind", "directions", "rollout", "recheck", "shadow"}
    assert set(spec["properties"]) == istio | weft
    assert spec["required"] == ["url"]
    props = spec["properties"]
    assert props["imagePullPolicy"]["enum"] == ["UNSPECIFIED_POLICY", "IfNotPresent", "Always"]
    assert props["failStrategy"]["enum"] == ["FAIL_CLOSE", "FAIL_OPEN"]  # no FAIL_RELOAD: weft has no such policy
    assert props["pluginConfig"] == {
        "description": props["pluginConfig"]["description"],
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    }
    assert props["priority"]["format"] == "int32"
    assert "higher priority run first" in props["priority"]["description"]
    assert set(props["selector"]["properties"]) == {"matchLabels"}


def test_status_schema():
    status = openapi_schema()["properties"]["status"]["properties"]
    assert set(status) >= {"conditions", "nodes", "servingSha256", "lastRollback", "observedGeneration", "phase"}
    conditions = status["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map" and conditions["x-kubernetes-list-map-keys"] == ["type"]
    condition = conditions["items"]
    # metav1.Condition's shape.
    assert set(condition["properties"]) == {
        "type", "status", "reason", "message", "lastTransitionTime", "observedGeneration",
    }
    assert condition["required"] == ["type", "status", "reason", "message", "lastTransitionTime"]
    assert set(status["nodes"]["properties"]) >= {"serving", "nacking", "rolledBack"}
    assert set(status["lastRollback"]["properties"]) == {"node", "sha256", "reason", "at"}


# --- (b) structural --------------------------------------------------------------------------------------------------

UNSUPPORTED = {"$ref", "definitions", "id", "$schema", "uniqueItems", "patternProperties", "dependencies",
               "additionalItems", "externalDocs"}
UNIONS = {"allOf", "anyOf", "oneOf", "not"}
SCALARS = {"string", "integer", "number", "boolean"}


def nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], f"{path}{{}}")


def structural_problems(schema: dict[str, Any]) -> list[str]:
    """What the API server's structural-schema check refuses (apiextensions' ValidateStructural), for the keywords
    this CRD can use."""
    problems = []
    for path, node in nodes(schema):
        where = path or "<root>"
        if "type" not in node and not node.get("x-kubernetes-preserve-unknown-fields") and not node.get(
            "x-kubernetes-int-or-string"
        ):
            problems.append(f"{where}: no type")
        if "properties" in node and "additionalProperties" in node:
            problems.append(f"{where}: properties and additionalProperties")
        if node.get("type") == "array" and not isinstance(node.get("items"), dict):
            problems.append(f"{where}: an array without one items schema")
        if node.get("type") != "array" and "items" in node:
            problems.append(f"{where}: items on a {node.get('type')}")
        if node.get("type") != "object" and ("properties" in node or "additionalProperties" in node):
            problems.append(f"{where}: properties on a {node.get('type')}")
        if bad := (UNSUPPORTED & set(node)) - ({"uniqueItems"} if node.get("uniqueItems") is False else set()):
            problems.append(f"{where}: {sorted(bad)} not allowed")
        if UNIONS & set(node):
            problems.append(f"{where}: {sorted(UNIONS & set(node))} (this CRD has no reason for value validation unions)")
        if node.get("additionalProperties") is False:
            problems.append(f"{where}: additionalProperties false (pruning does that)")
        list_type = node.get("x-kubernetes-list-type")
        if list_type == "set" and node["items"].get("type") not in SCALARS:
            problems.append(f"{where}: a set of non-scalar items")
        if list_type == "map":
            keys = node.get("x-kubernetes-list-map-keys") or []
            if not keys or not set(keys) <= set(node["items"].get("required", [])):
                problems.append(f"{where}: map list keys must be required fields of the items")
        elif "x-kubernetes-list-map-keys" in node:
            problems.append(f"{where}: list-map-keys without list-type map")
        if path.count(".") > 1 and path.endswith(".metadata"):
            problems.append(f"{where}: metadata below the root")
    root_metadata = schema["properties"].get("metadata", {})
    if set(root_metadata) - {"type", "description"}:
        problems.append(f".metadata: only name and generateName may be constrained, here {sorted(root_metadata)}")
    return problems


def test_schema_is_structural():
    assert structural_problems(openapi_schema()) == []


def test_structural_check_sees_what_it_should():
    bad = {
        "type": "object",
        "properties": {
            "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
            "a": {"description": "no type"},
            "b": {"type": "object", "properties": {"x": {"type": "string"}}, "additionalProperties": {"type": "string"}},
            "c": {"type": "array", "uniqueItems": True, "items": {"type": "string"}},
            "d": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "object"}},
            "e": {"type": "string", "anyOf": [{"pattern": "x"}]},
        },
    }
    found = "\n".join(structural_problems(bad))
    for what in [".a: no type", ".b: properties and additional", ".c: ['uniqueItems']", ".d: a set", ".e: ['anyOf']",
                 ".metadata: only name"]:
        assert what in found, found


def test_every_field_is_described():
    undescribed = [
        path for path, node in nodes(openapi_schema())
        if re.fullmatch(r"\.spec\.\w+", path) and "description" not in node
    ]
    assert undescribed == []


# --- (c) and (d): resources against the schema, CEL rules included ---------------------------------------------------

CEL = celpy.Environment()


def cel_rule(validator, rules, instance, schema):
    for rule in rules:
        program = CEL.program(CEL.compile(rule["rule"]))
        try:
            result = program.evaluate({"self": celpy.json_to_cel(instance)})
        except celpy.CELEvalError as err:  # e.g. duration() of what is no duration: the API server refuses it too
            result = err
        if isinstance(result, celpy.CELEvalError):
            yield jsonschema.ValidationError(f"CEL rule {rule['rule']!r} failed to evaluate: {result}")
        elif not bool(result):
            yield jsonschema.ValidationError(rule.get("message") or f"failed rule: {rule['rule']}")


def list_type(validator, kind, instance, schema):
    if not isinstance(instance, list):
        return
    if kind == "set":
        keys = [repr(v) for v in instance]
    elif kind == "map":
        keys = [tuple(repr(v.get(k)) for k in schema["x-kubernetes-list-map-keys"]) for v in instance]
    else:
        return
    if len(set(keys)) != len(keys):
        yield jsonschema.ValidationError(f"duplicate entries in a list of type {kind}: {instance!r}")


RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def format_(validator, fmt, instance, schema):
    if fmt in RANGES and isinstance(instance, int) and not isinstance(instance, bool):
        low, high = RANGES[fmt]
        if not low <= instance <= high:
            yield jsonschema.ValidationError(f"{instance} is out of the {fmt} range")
    if fmt == "date-time" and isinstance(instance, str):
        if not RFC3339.match(instance):
            yield jsonschema.ValidationError(f"{instance!r} is not an RFC 3339 date-time")
        else:
            datetime.datetime.fromisoformat(instance.replace("Z", "+00:00"))


KubeValidator = jsonschema.validators.extend(
    jsonschema.Draft4Validator,
    {"x-kubernetes-validations": cel_rule, "x-kubernetes-list-type": list_type, "format": format_},
)


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with unknown fields refused where the API server would prune them (kubectl's default field
    validation, Strict, refuses them instead)."""
    schema = copy.deepcopy(schema)
    for _, node in nodes(schema):
        if node.get("type") == "object" and "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
    return schema


VALIDATOR = KubeValidator(strict(openapi_schema()))


def problems(resource: dict[str, Any]) -> list[str]:
    out = []
    for e in VALIDATOR.iter_errors(resource):
        out.append(f"{'/'.join(str(p) for p in e.absolute_path)}: {e.message}")
    if resource.get("apiVersion") != "weft.dev/v1alpha1" or resource.get("kind") != "WeftPlugin":
        out.append(f"not a weft.dev/v1alpha1 WeftPlugin: {resource.get('apiVersion')} {resource.get('kind')}")
    return out


def resource(spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    r = {"apiVersion": "weft.dev/v1alpha1", "kind": "WeftPlugin", "metadata": {"name": "p", "namespace": "shop"},
         "spec": spec}
    if status is not None:
        r["status"] = status
    return r


SHA = "0167d5c6a3b2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6"
TIME = "2026-12-07T07:42:00Z"

GOOD = {
    "oci reference without a scheme": {"url": "registry.example.com/weft/allowlist:1.0"},
    "oci:// with a digest": {"url": f"oci://registry.example.com/weft/allowlist@sha256:{SHA}", "sha256": SHA},
    "registry with a port": {"url": "localhost:5000/allowlist:dev"},
    "registry by IPv6 address": {"url": "oci://[fd00::10]:5000/allowlist:dev"},
    "https with sha256": {"url": "https://plugins.example.com/a.wasm", "sha256": SHA},
    "every Istio field": {
        "url": "oci://registry.example.com/a:1", "sha256": SHA, "imagePullPolicy": "Always",
        "imagePullSecret": "regcred", "pluginConfig": {"nested": {"any": [1, "thing"]}}, "pluginName": "allowlist",
        "selector": {"matchLabels": {"app": "web", "app.kubernetes.io/version": "v1"}},
        "failStrategy": "FAIL_OPEN", "priority": -5,
    },
    "priority at the int32 bounds": {"url": "r.example/a:1", "priority": 2**31 - 1},
    "priority at the lower int32 bound": {"url": "r.example/a:1", "priority": -(2**31)},
    "both directions": {"url": "r.example/a:1", "kind": "policy", "directions": ["inbound", "outbound"]},
    "directions with the kind unset": {"url": "r.example/a:1", "directions": ["outbound"]},
    "telemetry": {"url": "r.example/a:1", "kind": "telemetry", "recheck": False},
    "rollout thresholds": {"url": "r.example/a:1", "rollout": {"window": "1m30s", "maxFailureRatio": 0, "minCalls": 1}},
    "rollout ratio of one": {"url": "r.example/a:1", "rollout": {"window": "500ms", "maxFailureRatio": 1}},
    "rollout staged only": {"url": "r.example/a:1", "rollout": {"nodes": ["node-a", "node-b"]}},
    "rollout in stages": {"url": "r.example/a:1", "rollout": {
        "stages": [{"nodes": 1, "bake": "2m", "shadowFirst": True}, {"percent": 50, "bake": "0s"}],
        "abortWhen": {"nacks": 0, "rollbacks": 1, "failureRatio": 0.01, "divergenceRatio": 0.001, "minCalls": 20},
    }},
    "rollout disabled": {"url": "r.example/a:1", "rollout": {"disabled": True}},
    "rollout disabled with a window": {"url": "r.example/a:1", "rollout": {"disabled": True, "window": "10s"}},
    "rollout not disabled, window only": {"url": "r.example/a:1", "rollout": {"disabled": False, "window": "2h"}},
    "a shadow version": {"url": "r.example/a:1", "kind": "policy",
                         "shadow": {"url": "r.example/a:2", "pluginConfig": {"ports": [8080]}}},
    "an https shadow with its sha256": {"url": "r.example/a:1", "shadow": {"url": "https://p.example/b.wasm",
                                                                          "sha256": SHA}},
}

FULL_STATUS = {
    "observedGeneration": 3,
    "phase": "Degraded",
    "conditions": [
        {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "", "lastTransitionTime": TIME,
         "observedGeneration": 3},
        {"type": "Ready", "status": "False", "reason": "RolledBack", "message": "node-b rolled it back",
         "lastTransitionTime": TIME, "observedGeneration": 3},
    ],
    "nodes": {"selected": 3, "serving": 2, "nacking": 0, "rolledBack": 1},
    "readyNodes": "2/3",
    "servingSha256": SHA,
    "lastRollback": {"node": "node-b", "sha256": SHA, "reason": "7 of 20 calls failed (5 traps, 2 timeouts)",
                     "at": TIME},
}

OCI = {"url": "r.example/a:1"}
BAD = {
    # the schema
    "no url": ({"sha256": SHA}, "'url' is a required property"),
    "empty url": ({"url": ""}, "url"),
    "file:// code": ({"url": "file://plugins/a.wasm"}, "url"),
    "file:// shadow": ({"url": "r.example/a:1", "shadow": {"url": "file:///a.wasm"}}, "url"),
    "shadow without url": ({"url": "r.example/a:1", "shadow": {"sha256": SHA}}, "'url' is a required property"),
    "https shadow without sha256": ({"url": "r.example/a:1", "shadow": {"url": "https://p.example/b.wasm"}},
                                    "shadow.sha256 is required"),
    "telemetry shadow": ({"url": "r.example/a:1", "kind": "telemetry", "shadow": {"url": "r.example/a:2"}},
                         "shadow is for policy plugins"),
    "file:/// absolute": ({"url": "file:///etc/a.wasm"}, "url"),
    "http:// code": ({"url": "http://plugins.example.com/a.wasm", "sha256": SHA}, "url"),
    "another scheme": ({"url": "ftp://plugins.example.com/a.wasm"}, "url"),
    "a host without a path": ({"url": "oci://registry.example.com"}, "url"),
    "a space in the url": ({"url": "oci://registry.example.com/a b:1"}, "url"),
    "sha256 too short": ({**OCI, "sha256": "abc123"}, "sha256"),
    "sha256 upper case": ({**OCI, "sha256": SHA.upper()}, "sha256"),
    "sha256 with a prefix": ({**OCI, "sha256": f"sha256:{SHA}"}, "sha256"),
    "kind": ({**OCI, "kind": "authz"}, "kind"),
    "failStrategy FAIL_RELOAD": ({**OCI, "failStrategy": "FAIL_RELOAD"}, "failStrategy"),
    "imagePullPolicy Never": ({**OCI, "imagePullPolicy": "Never"}, "imagePullPolicy"),
    "imagePullSecret not a name": ({**OCI, "imagePullSecret": "Reg Cred"}, "imagePullSecret"),
    "priority over int32": ({**OCI, "priority": 2**31}, "priority"),
    "priority under int32": ({**OCI, "priority": -(2**31) - 1}, "priority"),
    "priority a string": ({**OCI, "priority": "10"}, "priority"),
    "directions empty": ({**OCI, "directions": []}, "directions"),
    "directions twice the same": ({**OCI, "directions": ["inbound", "inbound"]}, "duplicate entries"),
    "directions three": ({**OCI, "directions": ["inbound", "outbound", "inbound"]}, "directions"),
    "directions unknown": ({**OCI, "directions": ["sideways"]}, "directions/0"),
    "pluginConfig a string": ({**OCI, "pluginConfig": "{\"ports\": [80]}"}, "pluginConfig"),
    "pluginName empty": ({**OCI, "pluginName": ""}, "pluginName"),
    "selector by namespace (the file format's)": ({**OCI, "selector": {"namespaces": ["shop"]}}, "namespaces"),
    "label value too long": ({**OCI, "selector": {"matchLabels": {"app": "x" * 64}}}, "matchLabels/app"),
    "Istio's match (not weft's)": ({**OCI, "match": [{"mode": "SERVER"}]}, "'match' was unexpected"),
    "Istio's phase (not weft's)": ({**OCI, "phase": "AUTHZ"}, "'phase' was unexpected"),
    "recheck a string": ({**OCI, "recheck": "yes"}, "recheck"),
    "rollout ratio over one": ({**OCI, "rollout": {"window": "1m", "maxFailureRatio": 1.5}}, "maxFailureRatio"),
    "rollout ratio negative": ({**OCI, "rollout": {"window": "1m", "maxFailureRatio": -0.1}}, "maxFailureRatio"),
    "rollout minCalls zero": ({**OCI, "rollout": {"window": "1m", "minCalls": 0}}, "minCalls"),
    "rollout window without a unit": ({**OCI, "rollout": {"window": "30"}}, "window"),
    "rollout window in words": ({**OCI, "rollout": {"window": "30 seconds"}}, "window"),
    "rollout nodes empty": ({**OCI, "rollout": {"nodes": []}}, "nodes"),
    "rollout nodes twice the same": ({**OCI, "rollout": {"nodes": ["a", "a"]}}, "duplicate entries"),
    "rollout unknown field": ({**OCI, "rollout": {"windw": "1m"}}, "'windw' was unexpected"),
    "stage with nodes and percent": (
        {**OCI, "rollout": {"stages": [{"nodes": 1, "percent": 5, "bake": "1m"}]}}, "exactly one of nodes and percent",
    ),
    "stage with neither": ({**OCI, "rollout": {"stages": [{"bake": "1m"}]}}, "exactly one of nodes and percent"),
    "stage without bake": ({**OCI, "rollout": {"stages": [{"nodes": 1}]}}, "bake"),
    "stage percent over 100": ({**OCI, "rollout": {"stages": [{"percent": 101, "bake": "1m"}]}}, "percent"),
    "stages empty": ({**OCI, "rollout": {"stages": []}}, "stages"),
    "stages and nodes": (
        {**OCI, "rollout": {"nodes": ["a"], "stages": [{"nodes": 1, "bake": "1m"}]}}, "either nodes",
    ),
    "abortWhen without stages": ({**OCI, "rollout": {"abortWhen": {"nacks": 1}}}, "abortWhen goes with stages"),
    "abort ratio over one": (
        {**OCI, "rollout": {"stages": [{"nodes": 1, "bake": "1m"}], "abortWhen": {"failureRatio": 2}}}, "failureRatio",
    ),
    # CEL rules
    "https without sha256": ({"url": "https://plugins.example.com/a.wasm"}, "sha256 is required for https://"),
    "window missing with thresholds": ({**OCI, "rollout": {"minCalls": 5}}, "window is required"),
    "window missing with a ratio": (
        {**OCI, "rollout": {"maxFailureRatio": 0.5, "nodes": ["a"]}}, "window is required",
    ),
    "window zero": ({**OCI, "rollout": {"window": "0s"}}, "the window must not be zero"),
    "window zero in two units": ({**OCI, "rollout": {"window": "0m0.0s"}}, "the window must not be zero"),
    "disabled with thresholds": (
        {**OCI, "rollout": {"disabled": True, "maxFailureRatio": 0.1}}, "disabled turns probation off",
    ),
    "pull secret for https code": (
        {"url": "https://p.example.com/a.wasm", "sha256": SHA, "imagePullSecret": "regcred"},
        "imagePullSecret is for oci://",
    ),
    "directions of a telemetry plugin": (
        {**OCI, "kind": "telemetry", "directions": ["inbound"]}, "directions is for policy plugins",
    ),
    "wildcard label value": ({**OCI, "selector": {"matchLabels": {"app": "web-*"}}}, "wildcard not allowed in label value"),
    "wildcard label key": ({**OCI, "selector": {"matchLabels": {"app*": "web"}}}, "wildcard not allowed in label key"),
    "empty label key": ({**OCI, "selector": {"matchLabels": {"": "web"}}}, "key must not be empty"),
}

BAD_STATUS = {
    "condition status Maybe": ({"conditions": [{**FULL_STATUS["conditions"][0], "status": "Maybe"}]}, "status"),
    "condition without a reason": (
        {"conditions": [{k: v for k, v in FULL_STATUS["conditions"][0].items() if k != "reason"}]},
        "'reason' is a required property",
    ),
    "two Ready conditions": (
        {"conditions": [FULL_STATUS["conditions"][1], FULL_STATUS["conditions"][1]]}, "duplicate entries",
    ),
    "transition time not a date-time": (
        {"conditions": [{**FULL_STATUS["conditions"][0], "lastTransitionTime": "yesterday"}]}, "date-time",
    ),
    "phase unknown": ({"phase": "Running"}, "phase"),
    "negative count": ({"nodes": {"serving": -1}}, "serving"),
    "readyNodes free text": ({"readyNodes": "all"}, "readyNodes"),
    "rollback without a node": ({"lastRollback": {"sha256": SHA, "at": TIME}}, "'node' is a required property"),
}


@pytest.mark.parametrize("case", sorted(GOOD))
def test_good_resources_pass(case):
    assert problems(resource(GOOD[case])) == []


def test_a_full_status_passes():
    assert problems(resource(OCI, FULL_STATUS)) == []


# What weft-control's leader writes, one per case of its status tests (runtime/control/src/kube/status/tests.rs
# writes this file with WEFT_UPDATE_FIXTURES=1 and fails when it is stale): every one must fit the CRD.
CONTROLLER_STATUSES = json.loads(
    (Path(__file__).parent / "fixtures" / "weftplugin-statuses.json").read_text()
)


@pytest.mark.parametrize("index", range(len(CONTROLLER_STATUSES)))
def test_the_controllers_statuses_fit_the_schema(index):
    status = CONTROLLER_STATUSES[index]
    assert problems(resource(OCI, status)) == [], json.dumps(status)


def test_the_controllers_statuses_cover_every_phase():
    assert {s["phase"] for s in CONTROLLER_STATUSES} == {"Pending", "Staged", "Ready", "Degraded", "Refused"}
    assert any(s.get("shadow", {}).get("samples") for s in CONTROLLER_STATUSES)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_resources_fail(case):
    spec, where = BAD[case]
    found = problems(resource(spec))
    assert found, f"{case}: accepted"
    assert any(where in p for p in found), found


@pytest.mark.parametrize("case", sorted(BAD_STATUS))
def test_bad_status_fails(case):
    status, where = BAD_STATUS[case]
    found = problems(resource(OCI, status))
    assert found and any(where in p for p in found), found


def cel_rules() -> list[dict[str, str]]:
    return [rule for _, node in nodes(openapi_schema()) for rule in node.get("x-kubernetes-validations", [])]


def test_every_cel_rule_compiles_and_has_a_message():
    for rule in cel_rules():
        CEL.compile(rule["rule"])
        assert rule.get("message"), rule


def test_every_cel_rule_refuses_some_bad_example():
    refused = {m for spec, _ in BAD.values() for m in problems(resource(spec))}
    for rule in cel_rules():
        assert any(rule["message"] in m for m in refused), f"no bad example breaks {rule['rule']!r}"


def test_every_string_a_cel_rule_reads_is_bounded():
    # The API server refuses a rule whose estimated cost is too high; unbounded strings and maps are what makes it
    # so. The strings these rules read: url, window, label keys and values.
    spec = openapi_schema()["properties"]["spec"]["properties"]
    assert spec["url"]["maxLength"] <= 2048
    assert spec["rollout"]["properties"]["window"]["maxLength"] <= 64
    labels = spec["selector"]["properties"]["matchLabels"]
    assert labels["additionalProperties"]["maxLength"] == 63 and labels["maxProperties"] <= 4096


# --- (e) in the chart ------------------------------------------------------------------------------------------------


def test_the_chart_carries_the_crd(chart):
    (crd,) = [c for c in chart.crds if c["filename"].endswith("weftplugins.weft.dev.yaml")]
    assert crd["filename"] == "weft/crds/weftplugins.weft.dev.yaml"
    assert yaml.safe_load(crd["data"]) == load_crd()


def test_crds_are_not_templated(render):
    # Helm installs crds/ as it is, before the templates, and only on install: no template may render a CRD (it
    # would be deleted with the release) and the file may hold no template directive.
    assert "{{" not in CRD_FILE.read_text()
    control = {"enabled": True, "tls": {"secretName": "t"}}
    configmap = {**control, "plugins": {"source": "configMap"}, "pluginsConfigMap": "p"}
    for values in [None, {"control": control}, {"control": configmap}]:
        rendered = render(values)
        assert rendered.objects
        assert "CustomResourceDefinition" not in rendered.kinds()
        assert not any(path.startswith("weft/crds/") for path in rendered.text)


def test_examples_ship_with_the_chart(chart):
    shipped = {f["name"] for f in chart.files}
    for example in EXAMPLES:
        assert f"examples/{example.name}" in shipped


# --- (f) every example ------------------------------------------------------------------------------------------------


def test_there_are_examples():
    assert {e.name for e in EXAMPLES} >= {"weftplugin-policy.yaml", "weftplugin-telemetry.yaml"}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_chart_examples_are_valid(example):
    docs = [d for d in yaml.safe_load_all(example.read_text()) if d is not None]
    assert docs
    for doc in docs:
        assert problems(doc) == []
        assert doc["metadata"].get("namespace"), "an example says which namespace it is for"


def markdown_weftplugins() -> list[tuple[str, int, dict[str, Any]]]:
    found = []
    for md in sorted(REPO.rglob("*.md")):
        rel = md.relative_to(REPO)
        if rel.parts[0] in {"target", ".git", "node_modules"} or any(p.startswith(".") for p in rel.parts):
            continue
        text = md.read_text(errors="replace")
        for m in re.finditer(r"^```ya?ml[^\n]*\n(.*?)^```", text, re.S | re.M):
            block = m.group(1)
            if not re.search(r"^kind: WeftPlugin\s*$", block, re.M):
                continue
            line = text[: m.start()].count("\n") + 1
            for doc in yaml.safe_load_all(block):
                if isinstance(doc, dict) and doc.get("kind") == "WeftPlugin":
                    found.append((f"{rel}:{line}", line, doc))
    return found


def test_docs_show_the_resource():
    assert any(where.startswith("docs/operations.md:") for where, _, _ in markdown_weftplugins())


@pytest.mark.parametrize("where,doc", [(w, d) for w, _, d in markdown_weftplugins()], ids=lambda x: x if isinstance(x, str) else "")
def test_markdown_examples_are_valid(where, doc):
    assert problems(doc) == [], where
