"""A job's etcd user needs readwrite on its namespace's prefix and nothing else (issue 35, item 1).

The user is set up with the ``etcdctl`` lines docs/security.md shows (:mod:`support.etcd_auth`,
checked against the docs here), on the session's etcd (auth on, logged in as root), each test
with its own namespace and user. The whole-job runs (2 agents, gloo workers, tokens that expire
every 3 s, both launchers) are in ``tests/chaos/test_etcd_auth.py``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from backends.errors import BackendPermissionError
from elastic.testing.agents import clean_env
from elastic.testing.etcd_server import ROOT_USER

from support.etcd_auth import JOB_PASSWORD, job_user_lines, least_privilege_lines, run_lines

pytestmark = pytest.mark.etcd

REPO = Path(__file__).resolve().parents[2]
SECURITY_DOC = REPO / "docs" / "security.md"


def doc_etcdctl_lines() -> list[str]:
    """The ``etcdctl`` lines of the ```bash block of docs/security.md that grants a prefix."""
    blocks = re.findall(r"^```bash\n(.*?)^```", SECURITY_DOC.read_text(), re.M | re.S)
    [block] = [block for block in blocks if "grant-permission" in block]
    return [line.strip() for line in block.splitlines() if line.strip().startswith("etcdctl ")]


@pytest.fixture
def job_user(etcd_server, tmp_path):
    """A fresh namespace and a user with readwrite on its prefix only: ``(namespace, user, password_file)``."""
    tag = uuid.uuid4().hex[:8]
    namespace, user = f"/lp-{tag}", f"job-{tag}"
    password = tmp_path / "job-password"
    password.write_text("job-secret\n")
    run_lines(job_user_lines(user, f"{namespace}/"), etcd_server.endpoints, {JOB_PASSWORD: "job-secret"},
              login=f"{ROOT_USER}:{etcd_server.options.password}")
    return namespace, user, password


def elasticrun(tmp_path: Path, endpoint: str, conf: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "elastic.run", "--nnodes=1", "--rdzv-backend=etcd", f"--rdzv-endpoint={endpoint}",
            "--rdzv-id=least-privilege", f"--rdzv-conf=last_call_timeout=1,{conf}", "-m", "this"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=clean_env(), cwd=tmp_path)


def test_the_security_docs_show_the_etcdctl_lines_the_tests_run():
    assert doc_etcdctl_lines() == list(least_privilege_lines("train-job", "/elastic/"))


def test_an_agent_starts_as_an_etcd_user_with_readwrite_on_its_namespace_only(etcd_server, job_user, tmp_path):
    namespace, user, password = job_user
    result = elasticrun(tmp_path, etcd_server.endpoints, f"namespace={namespace},user={user},password_file={password}")
    assert result.returncode == 0, result.stderr
    assert "Beautiful is better than ugly." in result.stdout  # the worker ran
    with etcd_server.connect(user=user, password="job-secret") as backend:
        with pytest.raises(BackendPermissionError):
            backend.get("/")  # the grant on the namespace is all the user had
    with etcd_server.connect() as root:
        keys = [kv.key for kv in root.get_prefix(f"{namespace}/").kvs]
    assert keys and all(key.startswith(f"{namespace}/least-privilege/") for key in keys), keys
