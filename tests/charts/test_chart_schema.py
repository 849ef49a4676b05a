"""Wrong values fail at `helm template`/`helm lint`, with a message naming the value, not in a
running job: values.schema.json for keys and types, the templates' checks for what a JSON schema
cannot compare (two fields against each other)."""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

import pytest
import yaml

from chartlib import CHART, helm_template, run_helm

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES_TEXT = (CHART / "values.yaml").read_text()

# Objects the schema deliberately leaves open, with why. Everything else is closed
# (additionalProperties: false) or a map whose values have a type.
OPEN_OBJECTS = {
    "/properties/global": "helm's globals, set by a parent chart",
    "/definitions/k8sObject": "Kubernetes objects passed through (affinity, security contexts): "
                              "kubernetes-validate checks them once rendered",
    "/definitions/volume": "a Kubernetes Volume has dozens of source types; checked once rendered",
    "/definitions/envVar/properties/valueFrom": "a Kubernetes EnvVarSource; checked once rendered",
}


def rejected(helm: str, overrides: dict[str, Any], profile: str | None = None) -> str:
    """helm template's error output for ``overrides``; fails the test if it renders."""
    result = helm_template(helm, profile, overrides)
    assert result.returncode != 0, f"helm template accepted {overrides}"
    return result.stderr


# -- the schema ----------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, path, misspelt", [
    ({"workers": {"nprocPerNod": 2}}, "/workers", "nprocPerNod"),
    ({"etcd": {"extrenal": {"endpoints": ["etcd:2379"]}}}, "/etcd", "extrenal"),
    ({"nnode": {"min": 1, "max": 2}}, "", "nnode"),
    ({"etcd": {"tls": {"enable": True}}}, "/etcd/tls", "enable"),
    ({"workers": {"rdzvConf": {"lease_tll": 5}}}, "/workers/rdzvConf", "lease_tll"),
    ({"workers": {"tolerations": [{"key": "gpu", "efect": "NoSchedule"}]}}, "/workers/tolerations/0", "efect"),
])
def test_schema_rejects_a_misspelt_key(helm, overrides, path, misspelt):
    error = rejected(helm, overrides)
    assert f"at '{path}': additional properties '{misspelt}' not allowed" in error


@pytest.mark.parametrize("replicas", [0, 2, 4, 6, 7])
def test_schema_rejects_an_even_or_unsupported_etcd_member_count(helm, replicas):
    assert "at '/etcd/replicas': value must be one of 1, 3, 5" in rejected(helm, {"etcd": {"replicas": replicas}})


def test_helm_lint_rejects_an_even_etcd_member_count_too(helm):
    result = run_helm(helm, "lint", "--strict", CHART, "--set", "etcd.replicas=4")
    assert result.returncode != 0
    assert "/etcd/replicas" in result.stdout + result.stderr


@pytest.mark.parametrize("overrides, path", [
    ({"workers": {"maxRestarts": "three"}}, "/workers/maxRestarts"),
    ({"workers": {"replicas": 2.5}}, "/workers/replicas"),
    ({"nnodes": {"min": 0}}, "/nnodes/min"),
    ({"workers": {"nprocPerNode": "many"}}, "/workers/nprocPerNode"),
    ({"workers": {"nprocPerNode": 0}}, "/workers/nprocPerNode"),
    ({"workers": {"rdzvConf": {"lease_ttl": 1}}}, "/workers/rdzvConf/lease_ttl"),
    ({"workers": {"rdzvConf": {"namespace": "elastic/"}}}, "/workers/rdzvConf/namespace"),
    ({"job": {"runId": "my run"}}, "/job/runId"),
    ({"job": {"command": "train.py"}}, "/job/command"),
    ({"etcd": {"external": {"endpoints": "etcd:2379"}}}, "/etcd/external/endpoints"),
    ({"etcd": {"antiAffinity": "strict"}}, "/etcd/antiAffinity"),
    ({"workers": {"metrics": {"port": 70000}}}, "/workers/metrics/port"),
    ({"workers": {"gpu": {"count": -1}}}, "/workers/gpu/count"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
])
def test_schema_rejects_a_wrong_type_or_range(helm, overrides, path):
    assert f"at '{path}'" in rejected(helm, overrides)


# -- what the templates check --------------------------------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    ({"nnodes": {"min": 5, "max": 2}, "workers": {"replicas": 2}},
     "nnodes.min (5) must not exceed nnodes.max (2)."),
    ({"workers": {"replicas": 5}},
     "workers.replicas (5) must be between nnodes.min (2) and nnodes.max (4)."),
    ({"workers": {"replicas": 1}},
     "workers.replicas (1) must be between nnodes.min (2) and nnodes.max (4)."),
    ({"workers": {"shutdownTimeout": 60, "terminationGracePeriodSeconds": 60}},
     "workers.terminationGracePeriodSeconds (60) must exceed workers.shutdownTimeout (60)"),
    ({"job": {"module": True, "noPython": True}},
     "job.module and job.noPython cannot both be true."),
    ({"workers": {"metrics": {"serviceMonitor": {"enabled": True}}}},
     "workers.metrics.serviceMonitor.enabled needs workers.metrics.enabled: true"),
    ({"etcd": {"tls": {"enabled": True, "serverSecretName": "s"}}},
     "etcd.tls.enabled needs etcd.tls.clientSecretName"),
    ({"etcd": {"tls": {"enabled": True, "clientSecretName": "c"}}},
     "etcd.tls.enabled with the bundled etcd needs etcd.tls.serverSecretName"),
    ({"etcd": {"auth": {"enabled": True}}},
     "etcd.auth.enabled needs etcd.auth.existingSecret: a Secret with the keys password and root-password."),
    ({"etcd": {"auth": {"enabled": True}, "external": {"endpoints": ["etcd:2379"]}}},
     "etcd.auth.enabled needs etcd.auth.existingSecret: a Secret with the keys password."),
    ({"etcd": {"external": {"endpoints": ["http://etcd:2379"]},
               "tls": {"enabled": True, "clientSecretName": "c"}}},
     "etcd.external.endpoints: http://etcd:2379 is http:// but etcd.tls.enabled is true"),
    ({"etcd": {"external": {"endpoints": ["https://etcd:2379"]}}},
     "etcd.external.endpoints: https://etcd:2379 is https:// but etcd.tls.enabled is false"),
])
def test_templates_refuse_inconsistent_values_with_a_clear_message(helm, overrides, message):
    assert message in rejected(helm, overrides)


def test_min_equal_to_max_is_a_fixed_size_job(helm):
    result = helm_template(helm, None, {"nnodes": {"min": 3, "max": 3}, "workers": {"replicas": 3}})
    assert result.returncode == 0, result.stderr
    assert "--nnodes=3:3" in result.stdout


# -- the schema and values.yaml stay complete and documented -----------------------------------
def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = SCHEMA["definitions"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _object_schemas(node: Any, where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        types = node.get("type")
        if types == "object" or (isinstance(types, list) and "object" in types):
            yield where, node
        for key, value in node.items():
            yield from _object_schemas(value, f"{where}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _object_schemas(value, f"{where}/{index}")


def test_every_object_in_the_schema_is_closed_or_a_declared_pass_through():
    open_objects = {where for where, node in _object_schemas(SCHEMA)
                    if node.get("additionalProperties") is not False
                    and not isinstance(node.get("additionalProperties"), dict)}
    assert open_objects == set(OPEN_OBJECTS)


# Definitions shaped like Kubernetes objects: their fields are Kubernetes', not the chart's.
KUBERNETES_SHAPED = {"resources", "tolerations", "toleration", "envVar", "envFromSource", "volumeMount", "volume",
                     "networkPolicyPeer", "k8sObject", "stringMap", "quantityMap"}


def _kubernetes_shaped(node: dict[str, Any]) -> bool:
    return node.get("$ref", "").rsplit("/", 1)[-1] in KUBERNETES_SHAPED


def _chart_keys(node: dict[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Paths of the keys the chart defines (not those inside Kubernetes objects or maps)."""
    if _kubernetes_shaped(node):
        return
    node = _resolve(node)
    for key, child in node.get("properties", {}).items():
        yield prefix + (key,)
        yield from _chart_keys(child, prefix + (key,))


def _value_at(values: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        values = values[key]
    return values


def test_values_yaml_sets_every_key_the_schema_defines():
    values = yaml.safe_load(VALUES_TEXT)
    missing = []
    for path in _chart_keys(SCHEMA):
        if path in (("global",),):
            continue
        try:
            _value_at(values, path)
        except (KeyError, TypeError):
            missing.append(".".join(path))
    assert not missing, f"keys in values.schema.json without a default in values.yaml: {missing}"


def _values_key_lines() -> Iterator[tuple[int, tuple[str, ...], bool]]:
    """(line number, key path, whether a comment line sits right above) for every mapping key
    of values.yaml outside lists."""
    stack: list[tuple[int, str]] = []
    lines = VALUES_TEXT.splitlines()
    for number, line in enumerate(lines):
        match = re.match(r"^( *)([A-Za-z0-9_.\-/]+):", line)
        if not match:
            continue
        indent, key = len(match.group(1)), match.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        commented = number > 0 and lines[number - 1].strip().startswith("#")
        yield number + 1, tuple(k for _, k in stack), commented


def _is_chart_key(path: tuple[str, ...]) -> bool:
    node: dict[str, Any] = SCHEMA
    for key in path[:-1]:
        node = _resolve(node).get("properties", {}).get(key)
        if node is None or _kubernetes_shaped(node):
            return False
    return path[-1] in _resolve(node).get("properties", {})


def test_every_key_of_values_yaml_has_a_comment():
    """Keys the chart defines each have a comment line right above them; keys inside Kubernetes
    objects (security contexts, resources) are that object's own fields."""
    uncommented = [f"line {number}: {'.'.join(path)}" for number, path, commented in _values_key_lines()
                   if _is_chart_key(path) and not commented]
    assert not uncommented, uncommented
    assert sum(1 for _, path, _ in _values_key_lines() if _is_chart_key(path)) > 80


def test_every_schema_property_has_a_description():
    undocumented = []
    for path in _chart_keys(SCHEMA):
        node: dict[str, Any] = SCHEMA
        for key in path:
            node = _resolve(node)["properties"][key]
        if "description" not in node and "description" not in _resolve(node):
            undocumented.append(".".join(path))
    assert not undocumented

