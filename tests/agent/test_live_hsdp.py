"""HSDP under ``elasticrun --live-recovery``: ``examples/train_hsdp_live.py`` on two real agents
of two workers each (one FSDP2 replica per node, gloo, CPU) on a real etcd.

In one run a worker of node b is SIGKILLed (its replica breaks: its partner exits and both are
replaced, then heal shard by shard), then node b's whole process tree is SIGKILLed and a new
agent started in its place (a returning node: it heals shard by shard). The healthy replica
(node a) keeps its processes and trains through both faults. In another, node b's whole process
tree is frozen (SIGSTOP) until the healthy replica trains alone, then thawed: the healthy replica
waits at most for b's lease, and b's replica comes back in its own processes and heals shard by
shard. The measured figures are printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from elastic.testing import agents
from e2e import FAST_CONF, LEASE_TTL, run_id

from support.freeze import freeze, thaw

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.needs_torch]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_hsdp_live.py"
STEPS = 500
STEP_TIME = 0.03
FAULT_STEP = 25
REJOIN = 0.1
"""``--rdzv-conf rejoin_timeout``: a lost node costs this plus a formation (docs/live-recovery.md)."""
BETWEEN = 20
"""Steps the whole job trains between the replica's return and the node loss."""
DONE = re.compile(r"rank (\d+) done: step (\d+), lr (\S+), shard (\d+) of (\d+), params ([0-9a-f]+)")


def _agent(procs, etcd_server, rid: str, name: str, events: Path) -> agents.Launched:
    config = etcd_server.client_config()
    env = agents.clean_env(TMPDIR=str(procs.workdir), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return procs.elasticrun(
        "--nnodes", "1:2", "--nproc-per-node", "2", "--max-restarts", "3", "--live-recovery",
        "--rdzv-backend", "etcd", "--rdzv-endpoint", etcd_server.endpoints, "--rdzv-id", rid,
        "--rdzv-conf", f"{FAST_CONF},rejoin_timeout={REJOIN:g},user={config.user},password={config.password}",
        "--local-addr", "127.0.0.1", str(EXAMPLE), "--steps", str(STEPS), "--step-time", str(STEP_TIME),
        "--events", str(events), name=name, env=env)


def _events(directory: Path) -> dict[int, list[dict]]:
    """Each worker's events by pid (a line still being written is left for the next look)."""
    found = {}
    for path in directory.glob("*.jsonl"):
        lines = []
        for text in path.read_text().splitlines():
            try:
                lines.append(json.loads(text))
            except json.JSONDecodeError:
                break
        found[int(path.stem)] = lines
    return found


def _steps(lines: list[dict]) -> list[dict]:
    return [line for line in lines if line["ev"] == "step"]


def _trained(directory: Path, step: int, world: int, shards: int = 2) -> bool:
    """Whether ``shards`` workers of ``directory`` committed ``step`` or later in a group of ``world``."""
    workers = _events(directory).values()
    return sum(any(s["step"] >= step and s["world"] == world for s in _steps(lines)) for lines in workers) >= shards


def _kill_stray_workers(*directories: Path) -> None:
    for directory in directories:
        for pid in _events(directory):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_an_hsdp_replica_heals_shard_by_shard_after_a_worker_crash_and_a_node_loss(procs, etcd_server, tmp_path):
    rid = run_id()
    dirs = {name: tmp_path / name for name in ("a", "b", "b2")}
    for directory in dirs.values():
        directory.mkdir()
    try:
        for name in ("a", "b"):
            _agent(procs, etcd_server, rid, name, dirs[name])
        procs.wait_for("both replicas past the fault step", lambda: _trained(dirs["b"], FAULT_STEP, 4), names=["a", "b"])
        first_b = _events(dirs["b"])
        [victim] = [pid for pid, lines in first_b.items() if lines[0]["shard"] == 1]
        crashed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        procs.wait_for("node b's replica to be replaced and to train again",
                       lambda: sum(pid not in first_b and any(s["world"] == 4 for s in _steps(lines))
                                   for pid, lines in _events(dirs["b"]).items()) == 2, names=["a", "b"])
        back = max(s["step"] for lines in _events(dirs["a"]).values() for s in _steps(lines))
        procs.wait_for("the whole job to train on", lambda: _trained(dirs["a"], back + BETWEEN, 4), names=["a", "b"])
        at_loss = max(s["step"] for lines in _events(dirs["a"]).values() for s in _steps(lines))
        lost = time.monotonic()
        procs["b"].kill_tree()
        procs.wait_for("node a to train alone", lambda: _trained(dirs["a"], at_loss + 5, 2), names=["a"])
        _agent(procs, etcd_server, rid, "b2", dirs["b2"])
        procs.wait_for("node b to come back and train", lambda: _trained(dirs["b2"], 0, 4), names=["a", "b2"])
        assert [procs[name].wait(120) for name in ("a", "b2")] == [0, 0], procs.logs()
    finally:
        _kill_stray_workers(*dirs.values())
    a, b, b2 = (_events(dirs[name]) for name in ("a", "b", "b2"))
    done = {pid: DONE.fullmatch(lines[-1]["line"]) for events in (a, b2) for pid, lines in events.items()}
    assert len(done) == 4
    _assert_the_final_lines_agree(done)
    assert len(a) == 2, "the healthy replica's workers were replaced"
    for pid, lines in {**a, **b, **b2}.items():
        committed = [s["step"] for s in _steps(lines)]
        assert committed == list(range(committed[0], committed[0] + len(committed))), f"pid {pid} redid a step"
    for pid, lines in a.items():
        assert [s["step"] for s in _steps(lines)] == list(range(STEPS)), f"healthy pid {pid} skipped steps"
    gaps = {fault: max(_gap(lines, at, until) for lines in a.values())
            for fault, at, until in (("crash", crashed, lost), ("node loss", lost, float("inf")))}
    heals = [r for events in (b, b2) for lines in events.values() for r in lines
             if r["ev"] == "recovery" and r["role"] == "receiver" and r["step"] > FAULT_STEP]
    print(f"\nhsdp: the healthy replica's longest step gap (seconds, step): {gaps}; "
          f"heals (bytes, seconds): {[(r['nbytes'], round(r['healed'] - r['formed'], 3)) for r in heals]}")
    assert len(heals) == 4, heals  # two replacements, two returning workers: one shard each
    # A shard, not the model: the model's parameters and AdamW's two moments are 3 * 1153 floats.
    assert all(r["nbytes"] < 3 * 1153 * 4 for r in heals), heals
    assert max(gap for gap, _ in gaps.values()) <= 0.5, gaps


def _assert_the_final_lines_agree(done: dict[int, re.Match | None]) -> None:
    """Every worker printed its ``rank R done:`` line, all at the last step with one lr, and the
    ranks of each shard index with one checksum."""
    assert all(done.values()), done
    finals = {(m[2], m[3]) for m in done.values()}
    assert finals == {(str(STEPS), next(iter(finals))[1])}, f"the ranks ended at different steps or lrs: {finals}"
    by_shard = {}
    for m in done.values():
        by_shard.setdefault(m[4], set()).add(m[6])
    assert sorted(by_shard) == ["0", "1"] and all(len(sums) == 1 for sums in by_shard.values()), by_shard


def _gap(lines: list[dict], after: float, until: float) -> tuple[float, int]:
    """The longest time between two committed steps, the later one in (``after``, ``until``]."""
    done = _steps(lines)
    return max((later["t"] - earlier["t"], later["step"]) for earlier, later in zip(done, done[1:])
               if after < later["t"] <= until)


FREEZE_GAP = LEASE_TTL + 1.5
"""The most a frozen node may cost the healthy replica, as its longest step gap (seconds). Its
collectives hang and nothing fails, so only etcd's expiry of the frozen agent's lease moves the
round on: due ``LEASE_TTL`` after its last renewal at the latest (the renewal precedes the
freeze), and etcd's lessor revokes expired leases on a 0.5 s tick. Then the path of a node
loss, which the test above bounds at 0.5 s: the rejoin window (``REJOIN``), the replica's
formation and the step run again; and 0.5 s more for CI's main leg, two test workers on two
cores (three runs alone measured 1.95-2.71 s with a 2 s lease)."""
HELD = 5
"""Steps the healthy replica trains alone before node b is thawed."""


def test_a_frozen_hsdp_node_costs_the_healthy_replica_at_most_the_lease_ttl(procs, etcd_server, tmp_path):
    rid = run_id()
    dirs = {name: tmp_path / name for name in ("a", "b")}
    for directory in dirs.values():
        directory.mkdir()
    frozen_pids: list[int] = []
    try:
        for name in ("a", "b"):
            _agent(procs, etcd_server, rid, name, dirs[name])
        procs.wait_for("both replicas past the fault step", lambda: _trained(dirs["b"], FAULT_STEP, 4), names=["a", "b"])
        # The agent, its store helper, its templates and its workers (forked from the templates).
        frozen_pids = sorted({process.pid for process in procs["b"].tree()} | set(_events(dirs["b"])))
        frozen = time.monotonic()
        for pid in frozen_pids:
            os.kill(pid, signal.SIGSTOP)  # all at once, as a machine that hangs
        for pid in frozen_pids:
            freeze(pid)  # SIGSTOP again, and wait until every thread of it has stopped
        at_freeze = max(s["step"] for lines in _events(dirs["a"]).values() for s in _steps(lines))
        procs.wait_for("node a to train alone", lambda: _trained(dirs["a"], at_freeze + HELD, 2), names=["a"])
        for pid in frozen_pids:
            thaw(pid)
        thawed = time.monotonic()
        assert [procs[name].wait(120) for name in ("a", "b")] == [0, 0], procs.logs()
    finally:
        for pid in frozen_pids:  # a failed wait may leave them stopped: SIGCONT before any SIGKILL
            try:
                thaw(pid)
            except ProcessLookupError:
                pass
        _kill_stray_workers(*dirs.values())
    a, b = (_events(dirs[name]) for name in ("a", "b"))
    assert len(a) == 2, "the healthy replica's workers were replaced"
    assert len(b) == 2, "the frozen replica's workers were replaced"
    done = {pid: DONE.fullmatch(lines[-1]["line"]) for events in (a, b) for pid, lines in events.items()}
    _assert_the_final_lines_agree(done)
    for pid, lines in a.items():
        assert [s["step"] for s in _steps(lines)] == list(range(STEPS)), f"healthy pid {pid} redid or skipped steps"
    for pid, lines in b.items():  # left behind while frozen, it jumps ahead at its heal
        committed = [s["step"] for s in _steps(lines)]
        assert committed == sorted(set(committed)), f"pid {pid} committed a step twice"
    heals = [r for lines in b.values() for r in lines
             if r["ev"] == "recovery" and r["role"] == "receiver" and r["formed"] > thawed]
    assert sorted(r["pid"] for r in heals) == sorted(b), heals  # each thawed rank healed, once
    assert all(r["step"] > at_freeze + HELD and r["nbytes"] < 3 * 1153 * 4 for r in heals), heals  # a shard each
    lost = min((r for lines in a.values() for r in lines if r["ev"] == "recovery" and r["formed"] > frozen),
               key=lambda r: r["formed"])
    gap = max(_gap(lines, frozen, thawed) for lines in a.values())
    back = max(_gap(lines, thawed, float("inf")) for lines in a.values())
    print(f"\nhsdp freeze: the healthy replica's longest step gap {gap[0]:.3f}s (step {gap[1]}; re-formed alone "
          f"{lost['formed'] - frozen:.3f}s after SIGSTOP; lease TTL {LEASE_TTL:g}s, bound {FREEZE_GAP:g}s), "
          f"{back[0]:.3f}s after the thaw (step {back[1]}); heals (bytes, seconds): "
          f"{[(r['nbytes'], round(r['healed'] - r['formed'], 3)) for r in heals]}")
    assert gap[0] <= FREEZE_GAP, f"the healthy replica's step gap was {gap[0]:.2f}s at the freeze"
