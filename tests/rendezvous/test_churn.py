"""Seeded random churn on a real backend: node processes join, leave, die and freeze.

Each node is a process running ``churn_node.py`` (an agent's loop: ``next_rendezvous()``,
report, wait for a membership change, repeat). The test injects events drawn from a seeded
RNG — new nodes, clean leaves (SIGTERM), SIGKILLs, SIGSTOP for longer than the lease TTL then
SIGCONT — and checks after the run, from every report:

* per round: the reporters agree on the world size and the member list, each reporter's rank
  is its index in that list, so ranks are unique and within 0..W-1; a member that never
  reported the round was disturbed (killed, stopped or left) after it joined;
* per node: reported rounds strictly increase (never in two rounds at once), no wait in
  ``next_rendezvous`` exceeded the join timeout, no node reported an error;
* a frozen node rejoins a later round after SIGCONT (it noticed its lease was lost);
* once churn stops, every live node settles in one round with exactly the live nodes.

Every process is stopped by PID in a finally.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

import pytest

from elastic.testing.tcp_store import TcpStoreHarness

pytestmark = pytest.mark.slow

NODE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "churn_node.py")
SEED = int(os.environ.get("CHURN_SEED", "20240611"))
"""Reproduce a failure with CHURN_SEED=<seed>; every failure message names the seed."""
LEASE_TTL = 2.0
LAST_CALL = 0.3
JOIN_TIMEOUT = 20.0
MIN_NODES, MAX_NODES = 2, 6
INITIAL_NODES = 4
EVENTS = 14
EVENT_GAP = (0.8, 2.0)
FREEZE = LEASE_TTL + 1.5
REJOIN_WITHIN = LEASE_TTL + 8.0
SETTLE_WITHIN = 20.0


@dataclass
class Node:
    """One node process and what the test did to it (times are CLOCK_MONOTONIC)."""

    node_id: str
    process: subprocess.Popen
    spawned: float
    disturbed: list[float] = field(default_factory=list)
    frozen: list[float] = field(default_factory=list)
    thawed: list[float] = field(default_factory=list)
    frozen_until: float | None = None
    gone: bool = False

    @property
    def running(self) -> bool:
        return not self.gone and self.frozen_until is None


class ChurnCluster:
    """Node processes for one run of one backend, and the reports they send."""

    def __init__(self, backend_spec: dict) -> None:
        self.spec = {
            **backend_spec,
            "run_id": "churn", "namespace": f"/churn-{uuid.uuid4().hex[:10]}",
            "min_nodes": MIN_NODES, "max_nodes": MAX_NODES, "lease_ttl": LEASE_TTL,
            "last_call_timeout": LAST_CALL, "join_timeout": JOIN_TIMEOUT,
        }
        self.nodes: dict[str, Node] = {}
        self.reports: "queue.Queue[dict]" = queue.Queue()
        self.log: list[dict] = []
        self._count = 0

    # -- events ----------------------------------------------------------------------------
    def spawn(self) -> Node:
        self._count += 1
        node_id = f"n{self._count:02d}"
        process = subprocess.Popen(
            [sys.executable, NODE_SCRIPT, json.dumps({**self.spec, "node": node_id})],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        node = Node(node_id, process, time.monotonic())
        self.nodes[node_id] = node
        threading.Thread(target=self._read, args=(process,), daemon=True, name=f"reports-{node_id}").start()
        return node

    def leave(self, node: Node) -> None:
        node.disturbed.append(time.monotonic())
        node.gone = True
        os.kill(node.process.pid, signal.SIGTERM)

    def kill(self, node: Node) -> None:
        node.disturbed.append(time.monotonic())
        node.gone = True
        os.kill(node.process.pid, signal.SIGKILL)

    def freeze(self, node: Node, seconds: float) -> None:
        node.disturbed.append(time.monotonic())
        node.frozen.append(node.disturbed[-1])
        node.frozen_until = time.monotonic() + seconds
        os.kill(node.process.pid, signal.SIGSTOP)

    def thaw_due(self, now: float, force: bool = False) -> None:
        for node in self.nodes.values():
            if node.frozen_until is not None and (force or now >= node.frozen_until):
                os.kill(node.process.pid, signal.SIGCONT)
                node.frozen_until = None
                node.thawed.append(time.monotonic())

    # -- reports ---------------------------------------------------------------------------
    def _read(self, process: subprocess.Popen) -> None:
        for line in process.stdout:  # type: ignore[union-attr]
            line = line.strip()
            if line.startswith("{"):
                self.reports.put(json.loads(line))

    def drain(self) -> None:
        while True:
            try:
                self.log.append(self.reports.get_nowait())
            except queue.Empty:
                return

    def latest_rounds(self) -> dict[str, dict]:
        latest: dict[str, dict] = {}
        for report in self.log:
            if report["kind"] == "round":
                latest[report["node"]] = report
        return latest

    # -- cleanup ---------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every node process by PID: a clean leave first, SIGKILL for any that linger."""
        for node in self.nodes.values():
            if node.process.poll() is None:
                if node.frozen_until is not None:
                    os.kill(node.process.pid, signal.SIGCONT)
                os.kill(node.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for node in self.nodes.values():
            try:
                node.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.kill(node.process.pid, signal.SIGKILL)
                node.process.wait(timeout=5)


@pytest.fixture(params=["tcp", pytest.param("etcd", marks=pytest.mark.etcd)])
def backend_spec(request):
    if request.param == "tcp":
        harness = TcpStoreHarness()
        try:
            yield {"backend": "tcp", "endpoint": harness.endpoint, "token": harness.token}
        finally:
            harness.close()
    else:
        server = request.getfixturevalue("etcd_server")
        config = server.client_config()
        yield {"backend": "etcd", "endpoint": server.endpoints, "user": config.user, "password": config.password}


def test_random_churn_keeps_every_round_consistent_and_frozen_nodes_rejoin(backend_spec):
    rng = random.Random(SEED)
    cluster = ChurnCluster(backend_spec)
    try:
        for _ in range(INITIAL_NODES):
            cluster.spawn()
        _wait_settled(cluster, SETTLE_WITHIN)
        every_kind = rng.sample(["join", "leave", "kill", "freeze"], 4)  # each kind at least once
        for step in range(EVENTS):
            _sleep_thawing(cluster, rng.uniform(*EVENT_GAP))
            _inject(cluster, rng, every_kind[step] if step < len(every_kind) else None)
        _sleep_thawing(cluster, rng.uniform(*EVENT_GAP))
        _inject(cluster, rng, "freeze")  # the last event: this node must be seen to rejoin
        _sleep_thawing(cluster, FREEZE + 0.5)
        cluster.thaw_due(time.monotonic(), force=True)
        settled = _wait_settled(cluster, SETTLE_WITHIN)
        cluster.drain()
        _check_rounds(cluster)
        _check_nodes(cluster)
        rejoined = _check_frozen_nodes_rejoined(cluster)
        live = sorted(node.node_id for node in cluster.nodes.values() if not node.gone)
        assert sorted(settled["members"]) == live and settled["world"] == len(live)
        kinds = [event["kind"] for event in _injected(cluster)]
        assert {"join", "leave", "kill", "freeze"} <= set(kinds), f"some kind of event never happened: {kinds}"
        assert rejoined >= 1, "no frozen node was followed until it rejoined"
    finally:
        cluster.close()
        rounds = sorted({entry["round"] for entry in cluster.log if entry["kind"] == "round"})
        print(f"churn seed {SEED} ({backend_spec['backend']}): {len(rounds)} rounds, events {_injected(cluster)}")


# -- driving the churn -----------------------------------------------------------------------
def _inject(cluster: ChurnCluster, rng: random.Random, wanted: str | None = None) -> None:
    """Inject ``wanted`` if the cluster can take it, else draw an event it can take: keep at
    least MIN_NODES running (neither gone nor frozen) and at most MAX_NODES alive."""
    alive = [node for node in cluster.nodes.values() if not node.gone]
    running = [node for node in alive if node.running]
    choices = []
    if len(alive) < MAX_NODES:
        choices += ["join"] * 3
    if len(running) > MIN_NODES:
        choices += ["leave"] * 2 + ["kill"] * 2 + ["freeze"] * 2
    kind = wanted if wanted in choices else rng.choice(choices) if choices else "none"
    victim = rng.choice(sorted(running, key=lambda node: node.node_id)) if kind in ("leave", "kill", "freeze") else None
    if kind == "join":
        victim = cluster.spawn()
    elif kind == "leave":
        cluster.leave(victim)
    elif kind == "kill":
        cluster.kill(victim)
    elif kind == "freeze":
        cluster.freeze(victim, FREEZE)
    cluster.log.append({"kind": "injected", "event": kind, "node": victim.node_id if victim else None,
                        "t": time.monotonic()})


def _injected(cluster: ChurnCluster) -> list[dict]:
    return [{"kind": entry["event"], "node": entry["node"]} for entry in cluster.log if entry["kind"] == "injected"]


def _sleep_thawing(cluster: ChurnCluster, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while (now := time.monotonic()) < deadline:
        cluster.thaw_due(now)
        cluster.drain()
        _fail_on_errors(cluster)
        time.sleep(min(0.05, deadline - now))


def _wait_settled(cluster: ChurnCluster, within: float) -> dict:
    """Wait until every live node's latest report is one round of exactly the live nodes."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        cluster.drain()
        _fail_on_errors(cluster)
        live = {node.node_id for node in cluster.nodes.values() if not node.gone}
        latest = cluster.latest_rounds()
        reports = [latest.get(node_id) for node_id in live]
        if all(reports) and len({report["round"] for report in reports}) == 1:  # type: ignore[index]
            if set(reports[0]["members"]) == live:  # type: ignore[index]
                return reports[0]  # type: ignore[return-value]
        time.sleep(0.05)
    pytest.fail(f"the live nodes did not settle in one round within {within:g}s; "
                f"latest reports: {cluster.latest_rounds()}; events: {_injected(cluster)}")


def _fail_on_errors(cluster: ChurnCluster) -> None:
    errors = [report for report in cluster.log if report["kind"] == "error"]
    assert not errors, f"nodes reported errors: {errors}; events: {_injected(cluster)}"


# -- invariants ------------------------------------------------------------------------------
def _check_rounds(cluster: ChurnCluster) -> None:
    by_round: dict[int, list[dict]] = {}
    for report in cluster.log:
        if report["kind"] == "round":
            by_round.setdefault(report["round"], []).append(report)
    assert len(by_round) >= EVENTS // 2, f"only {len(by_round)} rounds formed: {sorted(by_round)}"
    for number, reports in sorted(by_round.items()):
        views = {(report["world"], tuple(report["members"])) for report in reports}
        assert len(views) == 1, f"round {number}: reporters disagree on the members: {views}"
        world, members = views.pop()
        assert world == len(members) and MIN_NODES <= world <= MAX_NODES
        ranks = [report["rank"] for report in reports]
        assert len(set(ranks)) == len(ranks), f"round {number}: duplicate ranks {ranks}"
        for report in reports:
            assert members[report["rank"]] == report["node"], f"round {number}: {report['node']} has the wrong rank"
        silent = set(members) - {report["node"] for report in reports}
        for node_id in silent:
            assert _disturbed_while_in(cluster, node_id, number), (
                f"round {number}: member {node_id} never reported it and was not disturbed; reports: {reports}"
            )
        if not silent:
            assert sorted(ranks) == list(range(world))


def _disturbed_while_in(cluster: ChurnCluster, node_id: str, round_number: int) -> bool:
    """Whether the test disturbed ``node_id`` after its last report of an earlier round."""
    earlier = [report["t"] for report in cluster.log
               if report["kind"] == "round" and report["node"] == node_id and report["round"] < round_number]
    since = max(earlier, default=cluster.nodes[node_id].spawned)
    return any(moment >= since for moment in cluster.nodes[node_id].disturbed)


def _check_nodes(cluster: ChurnCluster) -> None:
    for node_id in cluster.nodes:
        reports = [report for report in cluster.log if report["kind"] == "round" and report["node"] == node_id]
        rounds = [report["round"] for report in reports]
        assert rounds == sorted(set(rounds)), f"{node_id} reported rounds out of order or twice: {rounds}"
        waits = [report["waited"] for report in reports]
        assert all(wait < JOIN_TIMEOUT for wait in waits), f"{node_id} waited {max(waits):.1f}s for a round"


def _check_frozen_nodes_rejoined(cluster: ChurnCluster) -> int:
    """A node thawed after a freeze longer than the TTL soon reports a new round, on a new lease
    (it noticed its lease was lost); returns how many such rejoins were followed."""
    rejoined = 0
    for node in cluster.nodes.values():
        reports = [report for report in cluster.log if report["kind"] == "round" and report["node"] == node.node_id]
        for frozen, thawed in zip(node.frozen, node.thawed):
            before = [report for report in reports if report["t"] < frozen]
            # The first report after the thaw may still be a round that closed with the old
            # lease before it expired; the rejoin is the first report on another lease.
            old_lease = before[-1]["lease"] if before else None
            later = [report for report in reports if report["t"] > thawed and report["lease"] != old_lease]
            next_disturbance = min((moment for moment in node.disturbed if moment > thawed), default=None)
            if next_disturbance is not None and (not later or next_disturbance < later[0]["t"]):
                continue  # disturbed again before it could rejoin
            assert later, f"{node.node_id} never rejoined on a new lease after it was thawed"
            assert later[0]["t"] - thawed <= REJOIN_WITHIN, (
                f"{node.node_id} took {later[0]['t'] - thawed:.1f}s to rejoin after it was thawed"
            )
            rejoined += 1
    return rejoined
