"""Nodes arrive in any order and leave without warning: real agents, real gloo workers.

* A node started before its built-in store listens (a ``c10d`` node that does not host it, a
  ``tcp`` node before its ``elastic-store``) waits, says so, and forms the world once it is up.
* A node that is lost (SIGKILL) is named once with why, no longer expected, and the survivor's
  ``/metrics`` agree with its ``/healthz`` while it waits.

Helpers are ``e2e.py``; every process a test starts is stopped by PID at the end (``procs``).
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid

import pytest

from e2e import (FAST_CONF, LEASE_TTL, RUN_TIMEOUT, allreduces_at, assert_correct_allreduces, etcd_flags, loop_args, run_id,
                 script)
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


# -- a node that is lost -----------------------------------------------------------------------


def scrape(port: int) -> tuple[str, dict[str, float]]:
    """``/healthz``'s reason and the membership gauges of ``/metrics``, read back to back."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as health:
        reason = json.loads(health.read())["reason"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as metrics:
        text = metrics.read().decode()
    names = ("elastic_members", "elastic_nodes_waiting", "elastic_spares", "elastic_rendezvous_joined_nodes")
    # Each gauge is one series, labelled with the run and the node.
    return reason, {name: float(re.search(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M)[1]) for name in names}


def node_id_of(agent) -> str:
    """The node id an agent's console gives itself (``formed a world ...; node <id> runs rank``)."""
    return re.search(r"; node (\S+) runs ranks? ", agent.stderr)[1]


@pytest.mark.etcd
@pytest.mark.needs_torch
def test_a_killed_node_is_named_once_as_lost_and_the_gauges_agree_with_healthz_while_waiting(
        procs, reports, tmp_path, etcd_server):
    port = free_port()
    flags = etcd_flags(etcd_server)
    conf = flags.index("--rdzv-conf") + 1
    flags[conf] += ",join_timeout=120"
    worker = loop_args(reports, tmp_path / "stop")
    survivor = procs.elasticrun("--nnodes=2:4", "--nproc-per-node=1", "--max-restarts=3", f"--metrics-port={port}",
                                *flags, *worker, name="A")
    lost = procs.elasticrun("--nnodes=2:4", "--nproc-per-node=1", "--max-restarts=3", *flags, *worker, name="B")
    reports.wait_for("a world of 2", allreduces_at(2), [survivor, lost])
    assert scrape(port) == ("running", {"elastic_members": 2.0, "elastic_nodes_waiting": 0.0, "elastic_spares": 0.0,
                                        "elastic_rendezvous_joined_nodes": 0.0})
    lost_id = node_id_of(lost)
    lost.kill_tree()

    procs.wait_for("A to name B as lost", lambda: f"lost: {lost_id} (" in survivor.stderr, names=["A"])
    # While A waits, every gauge agrees with /healthz, at every look.
    for _ in range(5):
        assert scrape(port) == ("waiting for rendezvous (1 of 2)", {
            "elastic_members": 0.0, "elastic_nodes_waiting": 0.0, "elastic_spares": 0.0,
            "elastic_rendezvous_joined_nodes": 1.0})
        time.sleep(0.2)
    procs.wait_for("a later waiting line", lambda: len(waiting_lines(survivor)) >= 2 + first_lost(survivor),
                   names=["A"], timeout=30)
    lines = waiting_lines(survivor)
    named = [line for line in lines if lost_id in line]
    assert len([line for line in named if f"lost: {lost_id} (its lease expired: its agent was killed, hung or cut "
                                          "off from the store)" in line]) == 1, lines
    assert not any(lost_id in line for line in lines[first_lost(survivor) + 1:]), lines  # named once, then never
    assert not any(f"still expected: {lost_id}" in line for line in lines[first_lost(survivor):]), lines
    survivor.terminate()
    assert survivor.wait() == 143, survivor.stderr


def waiting_lines(agent) -> list[str]:
    return [line for line in agent.stderr.splitlines() if "): waiting for nodes:" in line]


def first_lost(agent) -> int:
    return next(i for i, line in enumerate(waiting_lines(agent)) if "; lost: " in line)


@pytest.mark.etcd
@pytest.mark.needs_torch
def test_an_uncounted_failure_names_the_member_that_is_absent(procs, reports, tmp_path, etcd_server):
    """A's worker fails on B's death (gloo: the peer closed the connection) well before B's lease
    expires (8 s here: a loaded machine may take seconds to run the worker), so A restarts for
    a failure, and the next round, without B, does not count it."""
    flags = etcd_flags(etcd_server)
    conf = flags.index("--rdzv-conf") + 1
    flags[conf] = flags[conf].replace(f"lease_ttl={LEASE_TTL:g}", "lease_ttl=8")
    worker = loop_args(reports, tmp_path / "stop")
    survivor = procs.elasticrun("--nnodes=1:2", "--nproc-per-node=1", "--max-restarts=3", *flags, *worker, name="A")
    lost = procs.elasticrun("--nnodes=1:2", "--nproc-per-node=1", "--max-restarts=3", *flags, *worker, name="B")
    reports.wait_for("a world of 2", allreduces_at(2), [survivor, lost])
    lost_id = node_id_of(lost)
    killed_at = lost.kill_tree().at
    reports.wait_for("A alone, training again", allreduces_at(1, after=killed_at), [survivor])
    (tmp_path / "stop").touch()
    assert survivor.wait() == 0, survivor.stderr
    assert f"worker failure not counted: {lost_id}, a member of the previous round, is absent from round 1" \
        in survivor.stderr, survivor.stderr
