"""Nodes arrive in any order and leave without warning: real agents, real gloo workers.

* A node started before its built-in store listens (a ``c10d`` node that does not host it, a
  ``tcp`` node before its ``elastic-store``) waits, says so, and forms the world once it is up.
* A node that is lost (SIGKILL) is named once with why, no longer expected, and the survivor's
  ``/metrics`` agree with its ``/healthz`` while it waits.

Helpers are ``e2e.py``; every process a test starts is stopped by PID at the end (``procs``).
"""

from __future__ import annotations

import time
import uuid

import pytest

from e2e import FAST_CONF, RUN_TIMEOUT, assert_correct_allreduces, run_id, script
from elastic.testing.ports import free_port

pytestmark = pytest.mark.slow

EARLY = 5.0
"""How long the early node runs before its store comes up."""


def store_flags(backend: str, port: int, run: str) -> list[str]:
    return ["--nnodes=2", "--nproc-per-node=1", f"--rdzv-backend={backend}", f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id={run}", "--local-addr=127.0.0.1"]


@pytest.mark.needs_torch
def test_a_c10d_node_started_before_its_host_waits_and_forms_the_world_with_it(procs, reports):
    port, run = free_port(), run_id()
    worker = [script("allreduce.py"), str(reports.path)]
    early = procs.elasticrun(*store_flags("c10d", port, run), f"--rdzv-conf={FAST_CONF},is_host=0", *worker, name="B")
    started = time.monotonic()
    procs.wait_for("B to say it waits for the host", lambda: "waiting for the c10d store host" in early.stderr,
                   names=["B"])
    time.sleep(max(0.0, EARLY - (time.monotonic() - started)))
    host = procs.elasticrun(*store_flags("c10d", port, run), f"--rdzv-conf={FAST_CONF}", *worker, name="A")

    assert host.wait() == 0, host.stderr
    assert early.wait() == 0, early.stderr
    assert_correct_allreduces(reports.all(), world=2)
    waiting = [line for line in early.stderr.splitlines() if "waiting for the c10d store host" in line]
    assert len(waiting) == 1, early.stderr  # said once: the host came within the 10 s between lines
    assert waiting[0].endswith(f"(node 127.0.0.1): waiting for the c10d store host at 127.0.0.1:{port} "
                               "(is_host=0): connection refused; 600 s left before the join timeout"), waiting


@pytest.mark.needs_torch
def test_tcp_nodes_started_before_their_elastic_store_wait_for_it(procs, reports, tmp_path):
    port, run = free_port(), run_id()
    token_file = tmp_path / "store.token"
    token_file.write_text(uuid.uuid4().hex)
    flags = [*store_flags("tcp", port, run), f"--rdzv-conf={FAST_CONF},token_file={token_file}"]
    agents = [procs.elasticrun(*flags, script("allreduce.py"), str(reports.path), name=name) for name in "AB"]
    procs.wait_for("both nodes to say they wait for the store",
                   lambda: all("waiting for the elastic-store at" in agent.stderr for agent in agents))
    time.sleep(EARLY)
    procs.tcp_store(port, token_file)

    assert [agent.wait(RUN_TIMEOUT) for agent in agents] == [0, 0], [agent.stderr for agent in agents]
    assert_correct_allreduces(reports.all(), world=2)


def test_a_node_whose_store_never_comes_fails_after_the_join_timeout_with_one_line(procs):
    port, run = free_port(), run_id()
    agent = procs.elasticrun(*store_flags("c10d", port, run), f"--rdzv-conf={FAST_CONF},is_host=0,join_timeout=3",
                             script("allreduce.py"), "/dev/null")
    assert agent.wait() == 1, agent.stderr
    assert agent.stderr.strip().splitlines()[-1] == (
        f"elasticrun: Rendezvous {run} (node 127.0.0.1): the c10d store host at 127.0.0.1:{port} (is_host=0) did not "
        "answer within the join timeout (3s): connection refused. Start the node that hosts it (the one whose "
        "address is 127.0.0.1, or with --rdzv-conf is_host=1) or fix --rdzv-endpoint; to wait longer, raise "
        "--rdzv-conf join_timeout."), agent.stderr
    assert "Traceback" not in agent.stderr
