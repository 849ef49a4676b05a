"""docker/worker.Dockerfile, read as text (CI has no Docker engine to build it): a non-root
image that installs this package with its etcd client, and agrees with the chart's values."""

from __future__ import annotations

import json
import re
import shlex
import tomllib

import yaml

from chartlib import CHART, REPO

DOCKERFILE = REPO / "docker" / "worker.Dockerfile"
DOCKERIGNORE = REPO / "docker" / "worker.Dockerfile.dockerignore"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in DOCKERFILE.read_text().splitlines()
                                          if not line.lstrip().startswith("#")))
    found = []
    for line in text.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def args_defaults() -> dict[str, str]:
    return dict(rest.split("=", 1) for keyword, rest in instructions() if keyword == "ARG" and "=" in rest)


def test_image_runs_as_the_fixed_non_root_user_the_chart_expects():
    users = [rest for keyword, rest in instructions() if keyword == "USER"]
    assert users, "no USER: the image would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, "a numeric UID lets Kubernetes check runAsNonRoot"
    assert gid.isdigit() and int(gid) != 0
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["workers"]["podSecurityContext"]["runAsUser"] == int(uid)
    assert values["workers"]["podSecurityContext"]["runAsGroup"] == int(gid)
    assert args_defaults()["UID"] == uid


def test_image_installs_this_package_with_the_etcd_client_and_torch():
    runs = [rest for keyword, rest in instructions() if keyword == "RUN"]
    installs = [shlex.split(run) for run in runs if "pip install" in run]
    package = [words for words in installs if any(w.startswith(".[") for w in words)]
    assert package, "no `pip install .[...]` of this package"
    extras = {e.strip() for w in package[0] if w.startswith(".[") for e in w[2:-1].split(",")}
    assert {"etcd", "rpc"} <= extras
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert {"etcd", "rpc"} <= set(pyproject["project"]["optional-dependencies"])
    assert any("torch==${TORCH_VERSION}" in words for words in installs)
    assert args_defaults()["TORCH_VERSION"] == re.search(r"torch==([\d.]+)", (REPO / ".ci" / "run").read_text())[1]


def test_image_copies_what_pip_install_needs_and_the_default_training_script():
    copies = [rest.split() for keyword, rest in instructions() if keyword == "COPY"]
    sources = {source for words in copies for source in words[:-1]}
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = {pattern.rstrip("*") for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= sources, "pip install . would miss a package"
    assert {"pyproject.toml", pyproject["project"]["readme"], "examples"} <= sources
    for source in sources:
        assert (REPO / source).exists(), source
    patterns = [line for line in DOCKERIGNORE.read_text().splitlines() if line and not line.startswith("#")]
    assert patterns[0] == "*", "the build context starts empty and lets in only what is copied"
    assert all(f"!{source}" in patterns or f"!{source}/" in patterns for source in sources)
    workdir = next(rest for keyword, rest in instructions() if keyword == "WORKDIR")
    script = yaml.safe_load((CHART / "values.yaml").read_text())["job"]["command"][0]
    assert script.startswith(workdir + "/") and (REPO / script.removeprefix(workdir + "/")).is_file()


def test_image_entrypoint_is_elasticrun_on_a_python_311_slim_base():
    assert args_defaults()["PYTHON_IMAGE"] == "python:3.11-slim"
    assert [rest for keyword, rest in instructions() if keyword == "FROM"] == ["${PYTHON_IMAGE}"]
    [entrypoint] = [rest for keyword, rest in instructions() if keyword == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["elasticrun"]
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "elasticrun" in pyproject["project"]["scripts"]
