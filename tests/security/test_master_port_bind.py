"""Finding 6 of round three: the workers' master port (an unauthenticated TCPStore) listens on
the node's published address when it is this host's, warns in one line before listening on
every interface when it is not (NAT'd or mistyped), and refuses an address that does not resolve.

:func:`reserve_port` runs inside a real network namespace (:class:`NamespaceLink`, root), where
the namespace end's address is local and the host end's is not; ``elasticrun`` runs with a
loopback alias and with a name that does not resolve, its gloo workers reporting where their
master port listens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from elastic.testing.ports import free_port
from hostile import REPO

from support.netns import NamespaceLink

PROBE = textwrap.dedent("""
    import json, logging, sys
    from elastic.rendezvous.ports import reserve_port
    warnings = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("elastic.rendezvous.ports").addHandler(handler)
    results = []
    for addr in sys.argv[1:]:
        before = len(warnings)
        try:
            sock = reserve_port(addr).take()
            results.append({"bound": sock.getsockname()[0], "warnings": warnings[before:]})
        except OSError as error:
            results.append({"error": str(error), "warnings": warnings[before:]})
    print(json.dumps(results))
""")


@pytest.fixture
def link():
    with NamespaceLink() as namespace:
        yield namespace


def test_inside_a_namespace_the_master_port_binds_the_local_address_and_warns_for_a_foreign_one(link):
    unresolvable = f"no-such-node-{uuid.uuid4().hex[:6]}.invalid"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(link.command([sys.executable, "-c", PROBE, link.ns_addr, link.host_addr, unresolvable,
                                        link.host_addr]),
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    local, foreign, missing, again = json.loads(proc.stdout)
    assert local == {"bound": link.ns_addr, "warnings": []}
    assert foreign["bound"] == again["bound"] == "0.0.0.0"
    (warning,) = foreign["warnings"]
    assert link.host_addr in warning and "--local-addr" in warning and "\n" not in warning
    assert again["warnings"] == []  # once per address, not per join
    assert "does not resolve" in missing["error"] and "--local-addr" in missing["error"]


LISTENING = """
import json, os, sys
import psutil
import torch.distributed as dist
dist.init_process_group("gloo")
port = int(os.environ["MASTER_PORT"])
bound = sorted({c.laddr.ip for c in psutil.net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == port})
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as out:
        json.dump({"bound": bound, "master_addr": os.environ["MASTER_ADDR"]}, out)
dist.destroy_process_group()
"""


def elasticrun(tmp_path, local_addr: str, script: str) -> subprocess.CompletedProcess:
    (tmp_path / "worker.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in [name for name in env if name.startswith("PET_")]:
        del env[name]
    return subprocess.run(
        [sys.executable, "-m", "elastic.run", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
         f"--rdzv-id=bind-{uuid.uuid4().hex[:6]}", "--nnodes=1", "--nproc-per-node=2", "--max-restarts=0",
         f"--local-addr={local_addr}", f"--log-dir={tmp_path / 'logs'}", str(tmp_path / "worker.py"),
         str(tmp_path / "report.json")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )


@pytest.mark.slow
def test_elasticrun_workers_meet_on_a_master_port_bound_to_the_node_address_only(tmp_path):
    proc = elasticrun(tmp_path, "127.0.0.2", LISTENING)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report == {"bound": ["127.0.0.2"], "master_addr": "127.0.0.2"}
    assert "not an address of this host" not in proc.stderr


def test_elasticrun_refuses_a_node_address_that_does_not_resolve_in_one_line(tmp_path):
    started = time.monotonic()
    proc = elasticrun(tmp_path, f"no-such-node-{uuid.uuid4().hex[:6]}.invalid", "raise SystemExit('a worker ran')\n")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    # every "elasticrun: " line but the exit summary, which names the phase the run failed in
    errors = [line for line in proc.stderr.splitlines()
              if line.startswith("elasticrun: ") and not line.startswith("elasticrun: run ")]
    assert len(errors) == 1 and "does not resolve" in errors[0] and "--local-addr" in errors[0], proc.stderr[-3000:]
    assert "a worker ran" not in proc.stderr
    assert time.monotonic() - started < 60
