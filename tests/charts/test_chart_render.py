"""The chart renders valid Kubernetes objects, wired as its values say, for every value profile.

Profiles live in charts/etcd-elastic/ci/ (helm's convention); None is the chart's defaults.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from typing import Any

import kubernetes_validate
import pytest
import yaml

from chartlib import (
    CHART,
    FULLNAME,
    NAMESPACE,
    PROFILES,
    REPO,
    Manifests,
    container,
    helm_template,
    mounts_of_secret,
    parse_agent_args,
    pod_labels,
    render,
    run_helm,
    selector_matches,
    template_args,
    values_for,
)

ALL_PROFILES = (None, *PROFILES)
# The oldest Kubernetes Chart.yaml accepts (kubeVersion >=1.27) and a current one; schemas ship
# with kubernetes-validate, so this runs offline.
VALIDATE_VERSIONS = ("1.27", "1.34")
CLIENT_SERVICE = f"{FULLNAME}-etcd"
HEADLESS_SERVICE = f"{FULLNAME}-etcd-headless"
CLIENT_HOST = f"{CLIENT_SERVICE}.{NAMESPACE}.svc.cluster.local"
DEFAULT_RUN_ID = re.compile(rf"{NAMESPACE}-job-[a-z0-9]{{6}}")
"""``<namespace>-<release>-<nonce>``: the nonce is drawn at install (helm template draws one each time)."""


def profile_id(profile: str | None) -> str:
    return profile or "defaults"


def agent(manifests: Manifests):
    return parse_agent_args(container(manifests.workers, "elasticrun")["args"])


def bundled(values: dict[str, Any]) -> bool:
    return not values["etcd"]["external"]["endpoints"]


def expected_endpoints(values: dict[str, Any]) -> str:
    tls = values["etcd"]["tls"]["enabled"]
    raw = values["etcd"]["external"]["endpoints"] or [f"{CLIENT_HOST}:2379"]
    return ",".join(f"https://{e}" if tls and "://" not in e else e for e in raw)


# -- helm lint and Kubernetes schemas ----------------------------------------------------------
@pytest.mark.parametrize("profile", ALL_PROFILES, ids=profile_id)
def test_helm_lint_strict_passes(helm, profile):
    args = ["lint", "--strict", CHART, "--namespace", NAMESPACE]
    if profile:
        args += ["--values", CHART / "ci" / f"{profile}-values.yaml"]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def check_service_monitor(doc: dict[str, Any]) -> None:
    """A minimal structural check of a prometheus-operator ServiceMonitor. It is a CRD, so
    kubernetes-validate has no schema for it; this checks the fields we set, with the types the
    CRD (monitoring.coreos.com/v1) declares."""
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
    assert all(isinstance(v, str) for v in doc["metadata"]["labels"].values())
    spec = doc["spec"]
    assert set(spec) <= {"selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels", "podTargetLabels"}
    assert isinstance(spec["selector"]["matchLabels"], dict) and spec["selector"]["matchLabels"]
    assert isinstance(spec["namespaceSelector"]["matchNames"], list)
    assert spec["endpoints"], "a ServiceMonitor without endpoints scrapes nothing"
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "scheme"}
        assert isinstance(endpoint["port"], str) and endpoint["path"].startswith("/")
        for key in ("interval", "scrapeTimeout"):
            assert re.fullmatch(r"[0-9]+(ms|s|m|h)", endpoint[key]), endpoint[key]


@pytest.mark.parametrize("version", VALIDATE_VERSIONS)
@pytest.mark.parametrize("profile", ALL_PROFILES, ids=profile_id)
def test_every_rendered_manifest_is_a_valid_kubernetes_object(rendered, profile, version):
    for doc in rendered[profile].docs:
        if doc["kind"] == "ServiceMonitor":
            check_service_monitor(doc)
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']} is invalid for Kubernetes {version}: "
                                 f"{error.caught.message} at {list(error.caught.path)}") from None


# -- the agent's command line ------------------------------------------------------------------
@pytest.mark.parametrize("profile", ALL_PROFILES, ids=profile_id)
def test_worker_arguments_equal_the_values(rendered, profile):
    values = values_for(profile)
    workers = values["workers"]
    line = agent(rendered[profile])
    assert line.one("--nnodes") == f"{values['nnodes']['min']}:{values['nnodes']['max']}"
    assert line.one("--nproc-per-node") == str(workers["nprocPerNode"])
    assert line.one("--rdzv-backend") == "etcd"
    assert line.one("--rdzv-endpoint") == expected_endpoints(values)
    if values["job"]["runId"]:
        assert line.one("--rdzv-id") == values["job"]["runId"]
    else:
        assert DEFAULT_RUN_ID.fullmatch(line.one("--rdzv-id")), line.one("--rdzv-id")
    assert line.one("--max-restarts") == str(workers["maxRestarts"])
    assert line.one("--shutdown-timeout") == str(workers["shutdownTimeout"])
    assert line.one("--exit-barrier-timeout") == str(workers["exitBarrierTimeout"])
    assert line.one("--local-addr") == "$(POD_IP)"
    engine = {k: str(v) for k, v in workers["rdzvConf"].items() if v is not None}
    conf = line.rdzv_conf()
    assert {k: v for k, v in conf.items() if k in engine or k in workers["rdzvConf"]} == engine
    assert line.extra == workers["extraArgs"]
    assert line.switches == (["--module"] if values["job"]["module"] else [])
    assert line.command == values["job"]["command"]


# -- the run id: one per install, kept by upgrades ---------------------------------------------
def test_every_install_draws_its_own_run_id_and_the_statefulset_carries_its_nonce(rendered, helm):
    ids = []
    for manifests in (rendered[None], render(helm)):
        run_id = agent(manifests).one("--rdzv-id")
        annotations = manifests.workers["metadata"]["annotations"]
        assert DEFAULT_RUN_ID.fullmatch(run_id), run_id
        assert run_id == f"{NAMESPACE}-job-{annotations['etcd-elastic/run-nonce']}"
        assert annotations["etcd-elastic/run-id"] == run_id
        ids.append(run_id)
    assert ids[0] != ids[1], "two installs under one release name would run under one run id"


def test_an_upgrade_keeps_the_run_id_it_reads_back_from_the_worker_statefulset(helm, tmp_path):
    """``helm template --dry-run=server --is-upgrade`` against a stand-in API server that holds the
    worker StatefulSet of an earlier install: its nonce is looked up and kept."""
    from fake_kube_api import FakeKubeApi

    workers = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {
        "name": f"{FULLNAME}-workers", "namespace": NAMESPACE, "annotations": {"etcd-elastic/run-nonce": "k3e9q2"}}}
    for held, expected in (({(NAMESPACE, f"{FULLNAME}-workers"): workers}, f"{NAMESPACE}-job-k3e9q2"),
                           ({}, None)):
        api = FakeKubeApi(held)
        try:
            result = run_helm(helm, *template_args(None, None, None), "--dry-run=server", "--is-upgrade",
                              "--kubeconfig", api.kubeconfig(tmp_path / "kubeconfig"))
        finally:
            api.close()
        assert result.returncode == 0, result.stderr
        assert f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets/{FULLNAME}-workers" in api.requests
        run_id = agent(Manifests([d for d in yaml.safe_load_all(result.stdout) if d])).one("--rdzv-id")
        if expected is not None:
            assert run_id == expected
        else:  # nothing to read back (the StatefulSet was deleted): a new one
            assert DEFAULT_RUN_ID.fullmatch(run_id) and run_id != f"{NAMESPACE}-job-k3e9q2", run_id


@pytest.mark.parametrize("run_id, idles", [("", True), ("resnet-run-7", False)])
def test_only_the_installs_own_run_id_lets_a_pod_arriving_after_the_end_idle(helm, run_id, idles):
    """The chart's own id can only have finished in this install (a pod recreated after the end
    idles); a given job.runId may be a finished job's, and its agents exit 3."""
    conf = agent(render(helm, None, {"job": {"runId": run_id}})).rdzv_conf()
    assert (conf.get("already_finished_ok") == "1") is idles


def test_default_endpoint_is_the_client_service_of_the_bundled_etcd(rendered):
    manifests = rendered[None]
    assert agent(manifests).one("--rdzv-endpoint") == "job-etcd-elastic-etcd.train.svc.cluster.local:2379"
    service = manifests.get("Service", CLIENT_SERVICE)
    assert service["spec"].get("clusterIP") != "None"
    assert [p["port"] for p in service["spec"]["ports"]] == [2379]
    assert selector_matches({"matchLabels": service["spec"]["selector"]}, pod_labels(manifests.etcd))
    assert not selector_matches({"matchLabels": service["spec"]["selector"]}, pod_labels(manifests.workers))


def test_external_mode_uses_the_given_endpoints_and_deploys_no_etcd(rendered):
    manifests = rendered["external-etcd"]
    assert agent(manifests).one("--rdzv-endpoint") == ",".join(f"etcd-{m}.infra.svc:2379" for m in "abc")
    assert agent(manifests).one("--rdzv-id") == "resnet-run-7"
    assert manifests.find("StatefulSet", f"{FULLNAME}-etcd") is None
    assert manifests.find("Service", CLIENT_SERVICE) is None
    assert manifests.find("PodDisruptionBudget", f"{FULLNAME}-etcd") is None
    assert manifests.find("NetworkPolicy", f"{FULLNAME}-etcd") is None
    assert manifests.of_kind("Job") == []


@pytest.mark.parametrize("profile", ALL_PROFILES, ids=profile_id)
def test_pod_ip_is_given_to_the_agent_from_the_downward_api(rendered, profile):
    env = {e["name"]: e for e in container(rendered[profile].workers, "elasticrun")["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


@pytest.mark.parametrize("profile", ALL_PROFILES, ids=profile_id)
def test_elasticrun_accepts_the_rendered_command_line(rendered, profile):
    """The real CLI parser (--dry-run) takes the rendered arguments: no misspelt or stale flag."""
    args = [a.replace("$(POD_IP)", "10.244.1.7") for a in container(rendered[profile].workers, "elasticrun")["args"]]
    result = subprocess.run([sys.executable, "-m", "elastic.run", "--dry-run", *args], capture_output=True,
                            text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr
    described = dict(re.findall(r"^(\w+):\s+(.*)$", result.stdout, re.M))
    line = agent(rendered[profile])
    assert described["rdzv_endpoint"] == line.one("--rdzv-endpoint")
    assert described["run_id"] == line.one("--rdzv-id")
    low, high = line.one("--nnodes").split(":")
    assert described["nnodes"].split()[0] == (low if low == high else f"{low}:{high}")
    assert described["local_addr"] == "10.244.1.7"


@pytest.mark.parametrize("profile", ALL_PROFILES, ids=profile_id)
def test_grace_period_exceeds_the_agent_shutdown_timeout(rendered, profile):
    workers = rendered[profile].workers
    grace = workers["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > int(agent(rendered[profile]).one("--shutdown-timeout"))
    configured = values_for(profile)["workers"]["terminationGracePeriodSeconds"]
    assert grace == (configured if configured is not None else values_for(profile)["workers"]["shutdownTimeout"] + 30)


def test_idle_wrapper_runs_elasticrun_with_the_same_arguments(rendered, helm):
    fixed = {"job": {"runId": "run-1"}}  # else each render draws its own nonce
    wrapped = container(render(helm, None, fixed).workers, "elasticrun")
    direct = container(render(helm, None, {**fixed, "workers": {"idleAfterSuccess": False}}).workers, "elasticrun")
    assert wrapped["command"] == ["/bin/sh", "/opt/etcd-elastic-chart/run-elasticrun.sh"]
    assert direct["command"] == ["elasticrun"]
    assert wrapped["args"] == direct["args"]


# -- TLS and auth --------------------------------------------------------------------------------
def test_tls_profile_uses_https_and_mounts_the_client_secret(rendered):
    manifests = rendered["tls-auth"]
    line = agent(manifests)
    assert line.one("--rdzv-endpoint") == f"https://{CLIENT_HOST}:2379"
    conf = line.rdzv_conf()
    for name in ("elasticrun", "wait-for-etcd"):
        [tls_dir] = mounts_of_secret(manifests.workers, name, "etcd-client-tls")
        [auth_dir] = mounts_of_secret(manifests.workers, name, "etcd-passwords")
    expected_files = tuple(f"{tls_dir}/{name}" for name in ("ca.crt", "tls.crt", "tls.key"))
    assert (conf["cacert"], conf["cert"], conf["key"]) == expected_files
    assert conf["user"] == "trainer"
    assert conf["password_file"] == f"{auth_dir}/password"
    volumes = {v["name"]: v for v in manifests.workers["spec"]["template"]["spec"]["volumes"]}
    auth_volume = next(v for v in volumes.values() if v.get("secret", {}).get("secretName") == "etcd-passwords")
    assert [item["key"] for item in auth_volume["secret"]["items"]] == ["password"], "only the user's password"
    init = container(manifests.workers, "wait-for-etcd")
    assert f"--endpoint={line.one('--rdzv-endpoint')}" in init["args"]
    assert f"--run-id={line.one('--rdzv-id')}" in init["args"]
    assert f"--conf={','.join(line.flags['--rdzv-conf'][1:])}" in init["args"]


def test_tls_profile_serves_etcd_over_tls_from_the_secrets(rendered):
    manifests = rendered["tls-auth"]
    etcd = manifests.etcd
    args = container(etcd, "etcd")["args"]
    flags = dict(a.partition("=")[::2] for a in args)
    [server_dir] = mounts_of_secret(etcd, "etcd", "etcd-server-tls")
    [peer_dir] = mounts_of_secret(etcd, "etcd", "etcd-peer-tls")
    assert flags["--listen-client-urls"] == "https://0.0.0.0:2379"
    assert flags["--listen-peer-urls"] == "https://0.0.0.0:2380"
    assert (flags["--cert-file"], flags["--key-file"], flags["--trusted-ca-file"]) == (
        f"{server_dir}/tls.crt", f"{server_dir}/tls.key", f"{server_dir}/ca.crt")
    assert (flags["--peer-cert-file"], flags["--peer-key-file"], flags["--peer-trusted-ca-file"]) == (
        f"{peer_dir}/tls.crt", f"{peer_dir}/tls.key", f"{peer_dir}/ca.crt")
    assert "--client-cert-auth" in args and "--peer-client-cert-auth" in args
    assert all(url.startswith("https://") for url in re.findall(r"=(\S+?://)", flags["--initial-cluster"]) if url)
    assert flags["--initial-cluster"].count("=https://") == 3


def test_external_tls_without_client_certificates_passes_only_the_ca(rendered):
    manifests = rendered["external-tls-auth"]
    line = agent(manifests)
    assert line.one("--rdzv-endpoint") == "https://etcd-0.example.net:2379,https://etcd-1.example.net:2379"
    conf = line.rdzv_conf()
    [tls_dir] = mounts_of_secret(manifests.workers, "elasticrun", "corp-etcd-ca")
    assert conf["cacert"] == f"{tls_dir}/ca.crt" and "cert" not in conf and "key" not in conf
    [auth_dir] = mounts_of_secret(manifests.workers, "elasticrun", "corp-etcd-password")
    assert conf["password_file"] == f"{auth_dir}/etcd-password"


def test_auth_setup_job_runs_only_for_the_bundled_etcd_with_auth(rendered):
    assert [p for p in ALL_PROFILES if rendered[p].of_kind("Job")] == ["tls-auth"]
    job = rendered["tls-auth"].get("Job", f"{FULLNAME}-etcd-auth-setup-r1")  # helm template's revision
    assert "annotations" not in job["metadata"], "a hook would run only after `helm install --wait` is done waiting"
    setup = container(job, "etcd-auth-setup")
    flags = dict(a.partition("=")[::2] for a in setup["args"])
    [admin_dir] = mounts_of_secret(job, "etcd-auth-setup", "etcd-passwords")
    [tls_dir] = mounts_of_secret(job, "etcd-auth-setup", "etcd-client-tls")
    assert flags["--endpoint"] == f"https://{CLIENT_HOST}:2379"
    assert flags["--user"] == "trainer"
    assert flags["--password-file"] == f"{admin_dir}/password"
    assert flags["--root-password-file"] == f"{admin_dir}/root-password"
    assert flags["--cacert"] == f"{tls_dir}/ca.crt"
    assert flags["--prefix"] == "/elastic/", "the job's user gets the rendezvous namespace and nothing more"
    assert setup["command"][-1].endswith("/etcd_auth_setup.py")


def test_the_auth_grant_and_the_init_containers_check_follow_the_rendezvous_namespace(helm):
    manifests = render(helm, "tls-auth", {"workers": {"rdzvConf": {"namespace": "/team-a"}}})
    job = manifests.get("Job", f"{FULLNAME}-etcd-auth-setup-r1")
    flags = dict(a.partition("=")[::2] for a in container(job, "etcd-auth-setup")["args"])
    assert flags["--prefix"] == "/team-a/"
    line = agent(manifests)
    assert line.rdzv_conf()["namespace"] == "/team-a"
    init = dict(a.partition("=")[::2] for a in container(manifests.workers, "wait-for-etcd")["args"])
    assert init["--run-id"] == line.one("--rdzv-id")  # it reads a key of the run, as the agent does
    assert init["--conf"].endswith(",namespace=/team-a") and init["--conf"].startswith("cacert=")


# -- etcd --------------------------------------------------------------------------------------
@pytest.mark.parametrize("replicas", [1, 3, 5])
def test_initial_cluster_lists_every_member_by_its_headless_dns_name(helm, replicas):
    manifests = render(helm, None, {"etcd": {"replicas": replicas}})
    etcd = manifests.etcd
    assert etcd["spec"]["replicas"] == replicas
    assert etcd["spec"]["serviceName"] == HEADLESS_SERVICE
    assert etcd["spec"]["podManagementPolicy"] == "Parallel"
    flags = dict(a.partition("=")[::2] for a in container(etcd, "etcd")["args"])
    domain = f"{HEADLESS_SERVICE}.{NAMESPACE}.svc.cluster.local"
    assert flags["--initial-cluster"] == ",".join(
        f"{FULLNAME}-etcd-{i}=http://{FULLNAME}-etcd-{i}.{domain}:2380" for i in range(replicas))
    assert flags["--name"] == "$(POD_NAME)"
    assert flags["--initial-advertise-peer-urls"] == f"http://$(POD_NAME).{domain}:2380"
    assert flags["--advertise-client-urls"] == f"http://$(POD_NAME).{domain}:2379"
    assert flags["--initial-cluster-state"] == "new"
    headless = manifests.get("Service", HEADLESS_SERVICE)
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True, "members must resolve each other before ready"
    assert selector_matches({"matchLabels": headless["spec"]["selector"]}, pod_labels(etcd))
    budget = manifests.get("PodDisruptionBudget", f"{FULLNAME}-etcd")
    assert budget["spec"]["minAvailable"] == replicas // 2 + 1


def test_etcd_members_keep_their_data_on_persistent_volumes(rendered):
    etcd = rendered[None].etcd
    [claim] = etcd["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data" and claim["spec"]["resources"]["requests"]["storage"] == "8Gi"
    mounts = {m["name"]: m["mountPath"] for m in container(etcd, "etcd")["volumeMounts"]}
    data_dir = dict(a.partition("=")[::2] for a in container(etcd, "etcd")["args"])["--data-dir"]
    assert data_dir.startswith(mounts["data"] + "/")
    single = rendered["single-etcd"].etcd
    assert "volumeClaimTemplates" not in single["spec"]
    assert {"name": "data", "emptyDir": {}} in single["spec"]["template"]["spec"]["volumes"]


@pytest.mark.parametrize("profile, kind", [(None, "preferred"), ("tls-auth", "required")], ids=["soft", "hard"])
def test_etcd_members_repel_each_other(rendered, profile, kind):
    etcd = rendered[profile].etcd
    anti = etcd["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    [key] = anti
    assert key.startswith(kind)
    [term] = anti[key]
    term = term.get("podAffinityTerm", term)
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert selector_matches(term["labelSelector"], pod_labels(etcd))
    assert not selector_matches(term["labelSelector"], pod_labels(rendered[profile].workers))


# -- NetworkPolicy, Services, budgets, identity ------------------------------------------------
def test_network_policy_admits_only_this_releases_clients_to_etcd(rendered):
    manifests = rendered[None]
    policy = manifests.get("NetworkPolicy", f"{FULLNAME}-etcd")
    spec = policy["spec"]
    etcd_labels, worker_labels = pod_labels(manifests.etcd), pod_labels(manifests.workers)
    test_labels = pod_labels(manifests.of_kind("Pod")[0])
    other_release_worker = {**worker_labels, "app.kubernetes.io/instance": "other"}
    assert spec["policyTypes"] == ["Ingress"]
    assert selector_matches(spec["podSelector"], etcd_labels)
    assert not selector_matches(spec["podSelector"], worker_labels)
    rules = {tuple(p["port"] for p in rule["ports"]): rule["from"] for rule in spec["ingress"]}
    assert set(rules) == {(2379,), (2380,)}

    def admitted(port: int, labels: dict[str, str]) -> bool:
        return any(selector_matches(peer["podSelector"], labels) for peer in rules[(port,)] if "podSelector" in peer
                   and "namespaceSelector" not in peer)

    assert admitted(2379, worker_labels) and admitted(2379, test_labels)
    assert not admitted(2379, other_release_worker)
    assert not admitted(2379, etcd_labels), "members do not use each other's client port"
    assert admitted(2380, etcd_labels)
    assert not admitted(2380, worker_labels) and not admitted(2380, test_labels)
    [auth_job] = rendered["tls-auth"].of_kind("Job")
    tls_policy = rendered["tls-auth"].get("NetworkPolicy", f"{FULLNAME}-etcd")
    assert any(selector_matches(peer["podSelector"], pod_labels(auth_job))
               for rule in tls_policy["spec"]["ingress"] if rule["ports"][0]["port"] == 2379 for peer in rule["from"])


def test_extra_client_peers_are_added_to_the_client_port_rule_only(rendered):
    policy = rendered["single-etcd"].get("NetworkPolicy", f"{FULLNAME}-etcd")
    extra = values_for("single-etcd")["networkPolicy"]["extraClientPeers"]
    by_port = {rule["ports"][0]["port"]: rule["from"] for rule in policy["spec"]["ingress"]}
    assert by_port[2379][1:] == extra
    assert len(by_port[2380]) == 1


@pytest.mark.parametrize("profile", ALL_PROFILES, ids=profile_id)
def test_services_statefulsets_and_budgets_select_their_own_pods(rendered, profile):
    manifests = rendered[profile]
    values = values_for(profile)
    owners = [manifests.workers] + ([manifests.etcd] if bundled(values) else [])
    for owner in owners:
        assert selector_matches(owner["spec"]["selector"], pod_labels(owner))
    pods = {owner["metadata"]["name"]: pod_labels(owner) for owner in owners}
    expected = {f"{FULLNAME}-workers": f"{FULLNAME}-workers", CLIENT_SERVICE: f"{FULLNAME}-etcd",
                HEADLESS_SERVICE: f"{FULLNAME}-etcd"}
    for service in manifests.of_kind("Service"):
        selected = [name for name, labels in pods.items()
                    if selector_matches({"matchLabels": service["spec"]["selector"]}, labels)]
        assert selected == [expected[service["metadata"]["name"]]]
    for budget in manifests.of_kind("PodDisruptionBudget"):
        selected = [name for name, labels in pods.items() if selector_matches(budget["spec"]["selector"], labels)]
        assert selected == [budget["metadata"]["name"]]
    workers_budget = manifests.get("PodDisruptionBudget", f"{FULLNAME}-workers")
    assert workers_budget["spec"]["minAvailable"] == values["nnodes"]["min"]
    assert manifests.workers["spec"]["serviceName"] == f"{FULLNAME}-workers"
    assert manifests.workers["spec"]["podManagementPolicy"] == "Parallel"
    assert manifests.workers["spec"]["replicas"] == values["workers"]["replicas"]


@pytest.mark.parametrize("profile", ALL_PROFILES, ids=profile_id)
def test_pods_run_as_a_service_account_without_rights_or_token(rendered, profile):
    manifests = rendered[profile]
    rbac = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
    assert not [doc for doc in manifests.docs if doc["kind"] in rbac]
    [account] = manifests.of_kind("ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    for owner, pod in manifests.pod_templates():
        assert pod["spec"]["serviceAccountName"] == account["metadata"]["name"], owner["metadata"]["name"]
        assert pod["spec"]["automountServiceAccountToken"] is False, owner["metadata"]["name"]
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True, owner["metadata"]["name"]


# -- workers' resources and scheduling ---------------------------------------------------------
def test_gpu_profile_requests_gpus_in_limits_and_schedules_on_gpu_nodes(rendered):
    workers = rendered["gpu"].workers
    values = values_for("gpu")["workers"]
    resources = container(workers, "elasticrun")["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 8
    assert resources["limits"]["memory"] == "300Gi" and resources["requests"] == values["resources"]["requests"]
    assert agent(rendered["gpu"]).one("--nproc-per-node") == "8"
    pod = workers["spec"]["template"]["spec"]
    assert pod["tolerations"] == values["tolerations"]
    assert pod["nodeSelector"] == values["nodeSelector"]
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in pod["volumes"]
    assert values["volumes"][0] in pod["volumes"]
    main = container(workers, "elasticrun")
    assert values["volumeMounts"][0] in main["volumeMounts"]
    assert {"name": "NCCL_DEBUG", "value": "WARN"} in main["env"]
    assert main["image"] == "registry.example.com/team/trainer:cu128-2024.1"


def test_default_workers_request_no_gpus(rendered):
    assert "resources" not in container(rendered[None].workers, "elasticrun")


# -- observability -----------------------------------------------------------------------------
def test_metrics_profile_serves_scrapes_and_charts_the_agent_metrics(rendered):
    manifests = rendered["metrics"]
    port = int(agent(manifests).one("--metrics-port"))
    assert agent(manifests).one("--metrics-addr") == "0.0.0.0"  # the agent's default is loopback
    main = container(manifests.workers, "elasticrun")
    assert main["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    service = manifests.get("Service", f"{FULLNAME}-workers")
    assert service["spec"]["ports"] == [{"name": "metrics", "port": port, "targetPort": "metrics"}]
    [monitor] = manifests.of_kind("ServiceMonitor")
    assert selector_matches(monitor["spec"]["selector"], service["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    assert monitor["spec"]["endpoints"][0]["interval"] == "15s"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_without_metrics_there_is_no_port_flag_or_service_monitor(rendered):
    assert "--metrics-port" not in agent(rendered[None]).flags
    assert rendered[None].of_kind("ServiceMonitor") == []
    assert "ports" not in container(rendered[None].workers, "elasticrun")


def test_dashboard_charts_only_metrics_and_labels_the_agent_exports(rendered):
    from elastic.agent.observe import metrics
    from support.dashboards import KUBERNETES_TARGET_LABELS, agent_series, dashboard_problems, parse_query

    [config_map] = [c for c in rendered["metrics"].of_kind("ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["etcd-elastic.json"])
    # Metric and label names (run_id, node on every series; namespace, pod from the ServiceMonitor).
    assert dashboard_problems(dashboard, agent_series(), KUBERNETES_TARGET_LABELS) == []
    expressions = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {selector.metric for expr in expressions for selector in parse_query(expr).selectors}
    for required in (metrics.ROUNDS_TOTAL, metrics.MEMBERS, metrics.RESTARTS_TOTAL):
        assert required in used
    restarts = next(p for p in dashboard["panels"] if metrics.RESTARTS_TOTAL in p["targets"][0]["expr"])
    assert "by (cause)" in restarts["targets"][0]["expr"]
    assert rendered[None].find("ConfigMap", f"{FULLNAME}-dashboard") is None


# -- helm test hook and the scripts ------------------------------------------------------------
@pytest.mark.parametrize("profile", ALL_PROFILES, ids=profile_id)
def test_helm_test_pod_checks_etcd_health_like_the_workers_connect(rendered, profile):
    manifests = rendered[profile]
    [pod] = manifests.of_kind("Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    etcdctl = container(pod, "etcdctl")
    assert etcdctl["command"] == ["/usr/local/bin/etcdctl"]
    assert etcdctl["args"][:2] == ["endpoint", "health"]
    flags = dict(a.partition("=")[::2] for a in etcdctl["args"][2:])
    line = agent(manifests)
    assert flags["--endpoints"] == line.one("--rdzv-endpoint")
    assert ("--cluster" in flags) == bundled(values_for(profile))
    conf = line.rdzv_conf()
    for ours, theirs in (("cacert", "--cacert"), ("cert", "--cert"), ("key", "--key")):
        assert flags.get(theirs) == conf.get(ours)
    env = {e["name"]: e for e in etcdctl.get("env", [])}
    if "user" in conf:
        assert env["ETCDCTL_USER"]["value"] == conf["user"]
        assert "secretKeyRef" in env["ETCDCTL_PASSWORD"]["valueFrom"]
    else:
        assert not env


def test_scripts_config_map_carries_the_chart_files_the_pods_run(rendered):
    manifests = rendered[None]
    [scripts] = [c for c in manifests.of_kind("ConfigMap") if c["metadata"]["name"] == f"{FULLNAME}-scripts"]
    for name in ("run-elasticrun.sh", "wait_for_etcd.py", "etcd_auth_setup.py"):
        assert scripts["data"][name].strip() == (CHART / "files" / name).read_text().strip()
    mount = next(m for m in container(manifests.workers, "elasticrun")["volumeMounts"] if m["name"] == "scripts")
    assert container(manifests.workers, "elasticrun")["command"][-1] == f"{mount['mountPath']}/run-elasticrun.sh"


def test_notes_tell_how_to_watch_scale_and_test_the_job(helm, tmp_path):
    """NOTES.txt is not part of `helm template`'s output, so a copy of the chart renders it into a
    ConfigMap through `tpl`, exactly as helm would."""
    chart = tmp_path / "etcd-elastic"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "files" / "NOTES.txt")
    (chart / "templates" / "zz-notes.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n'
        '  notes: {{ tpl (.Files.Get "files/NOTES.txt") . | toJson }}\n')
    result = helm_template(helm, "metrics", chart=chart)
    assert result.returncode == 0, result.stderr
    [config_map] = [d for d in yaml.safe_load_all(result.stdout) if d and d["metadata"]["name"] == "notes"]
    notes = config_map["data"]["notes"]
    assert f"kubectl -n {NAMESPACE} scale statefulset {FULLNAME}-workers --replicas=N" in notes
    assert "kubectl -n train logs -f -l app.kubernetes.io/instance=job,app.kubernetes.io/component=worker" in notes
    assert f"port-forward pod/{FULLNAME}-workers-0 9400" in notes
    assert "helm test job -n train" in notes
    run_id = agent(Manifests([d for d in yaml.safe_load_all(result.stdout) if d])).one("--rdzv-id")
    assert f'job "{run_id}"' in notes and "between 2 and 4 pods" in notes  # the same nonce in one render
    assert "an upgrade keeps it" in notes

