"""Finding 7: the chart's workers run on a read-only root filesystem, and every pod of the
release denies ingress except the flows the job needs (workers <-> workers, workers -> etcd,
the metrics port from a configurable peer). Rendered with the real helm, every value profile."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "charts"))

from chartlib import (  # noqa: E402
    PROFILES,
    container,
    helm_or_fail,
    helm_template,
    pod_labels,
    render,
    selector_matches,
    values_for,
)

ALL_PROFILES = (None, *PROFILES)


@pytest.fixture(scope="module")
def helm() -> str:
    return helm_or_fail()


@pytest.fixture(scope="module")
def rendered(helm):
    return {profile: render(helm, profile) for profile in ALL_PROFILES}


def pod_spec(owner):
    return owner["spec"]["template"]["spec"] if "template" in owner["spec"] else owner["spec"]


@pytest.mark.parametrize("profile", ALL_PROFILES, ids=lambda p: p or "defaults")
def test_worker_containers_have_a_read_only_root_and_a_writable_tmp(rendered, profile):
    workers = rendered[profile].workers
    spec = pod_spec(workers)
    tmp_volumes = {volume["name"] for volume in spec["volumes"] if "emptyDir" in volume}
    for item in spec["containers"] + spec.get("initContainers", []):
        assert item["securityContext"]["readOnlyRootFilesystem"] is True, item["name"]
    mounts = {mount["mountPath"]: mount["name"] for mount in container(workers, "elasticrun")["volumeMounts"]}
    assert mounts.get("/tmp") in tmp_volumes


def ingress_policies(manifests):
    return [policy for policy in manifests.of_kind("NetworkPolicy") if "Ingress" in policy["spec"]["policyTypes"]]


def admitted(manifests, target_labels, source_labels, port) -> bool:
    """Whether some policy selecting the target admits a same-namespace pod with ``source_labels``
    on ``port`` (a rule without ports admits every port)."""
    for policy in ingress_policies(manifests):
        if not selector_matches(policy["spec"]["podSelector"], target_labels):
            continue
        for rule in policy["spec"].get("ingress", []):
            ports = [item["port"] for item in rule.get("ports", [])]
            if ports and port not in ports:
                continue
            for peer in rule.get("from", []):
                if "podSelector" in peer and "namespaceSelector" not in peer \
                        and selector_matches(peer["podSelector"], source_labels):
                    return True
    return False


@pytest.mark.parametrize("profile", ALL_PROFILES, ids=lambda p: p or "defaults")
def test_every_pod_of_the_release_denies_ingress_by_default(rendered, profile):
    manifests = rendered[profile]
    for owner, _ in manifests.pod_templates():
        labels = pod_labels(owner)
        assert any(selector_matches(policy["spec"]["podSelector"], labels) for policy in ingress_policies(manifests)), \
            owner["metadata"]["name"]
        stranger = {"app": "something-else"}
        assert not any(admitted(manifests, labels, stranger, port) for port in (2379, 29400, 29500, 9400, 12345))


def test_workers_admit_their_own_release_on_every_port_and_nobody_else(rendered):
    manifests = rendered[None]
    workers = pod_labels(manifests.workers)
    other_release = {**workers, "app.kubernetes.io/instance": "other"}
    etcd = pod_labels(manifests.etcd)
    for port in (29400, 29500, 40000, 65000):  # c10d/torch stores, MASTER_PORT, gloo, RPC
        assert admitted(manifests, workers, workers, port)
        assert not admitted(manifests, workers, other_release, port)
        assert not admitted(manifests, workers, etcd, port)
    assert admitted(manifests, etcd, workers, 2379)


def test_the_metrics_port_admits_only_the_configured_peers(rendered):
    manifests = rendered["metrics"]
    port = values_for("metrics")["workers"]["metrics"]["port"]
    rules = [rule for policy in ingress_policies(manifests)
             if selector_matches(policy["spec"]["podSelector"], pod_labels(manifests.workers))
             for rule in policy["spec"].get("ingress", []) if rule.get("ports")]
    assert [[item["port"] for item in rule["ports"]] for rule in rules] == [[port]]
    assert rules[0]["from"] == values_for("metrics")["networkPolicy"]["metricsFrom"]
    assert not any(rule.get("ports") for policy in ingress_policies(rendered[None])
                   for rule in policy["spec"].get("ingress", []) if policy["metadata"]["name"].endswith("-workers"))


def test_the_schema_takes_the_hardening_values_and_refuses_malformed_ones(helm):
    peers = [{"podSelector": {"matchLabels": {"app": "prometheus"}}}]
    manifests = render(helm, None, {"networkPolicy": {"metricsFrom": peers},
                                    "workers": {"tmp": {"sizeLimit": "2Gi"}, "metrics": {"enabled": True}}})
    assert any(rule.get("from") == peers for policy in manifests.of_kind("NetworkPolicy")
               for rule in policy["spec"].get("ingress", []))
    for overrides, says in (({"networkPolicy": {"metricsFrom": "monitoring"}}, "metricsFrom"),
                            ({"workers": {"tmp": {"sizeLimit": 5}}}, "sizeLimit"),
                            ({"workers": {"tmp": {"size": "1Gi"}}}, "size")):
        result = helm_template(helm, None, overrides)
        assert result.returncode != 0 and says in result.stderr, result.stderr
