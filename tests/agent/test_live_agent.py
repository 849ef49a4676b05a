"""``elasticrun --live-recovery`` end to end: two real agents on a real etcd, one LiveTraining
DDP worker each (``tests/worker/workers/live_train.py``, gloo, CPU).

A worker crash: the survivor keeps its process and redoes no step, the crashed worker is
restarted alone and heals from the survivor. A node loss (the whole agent's process tree
SIGKILLed): the survivor trains on alone without a restart; the node comes back and heals. A
worker that takes long to be ready (a replacement, a joining node's; on GPUs CUDA's and the
model's start-up): the survivor trains on without it, and it joins at a later step (issue 37).
Every step starts with a parameter checksum all-reduced over the group (``LIVE_CHECK=1``), so
equal parameters after every recovery are checked on every step. The measured figures are
printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from elastic.testing import agents
from e2e import FAST_CONF, LAST_CALL, LEASE_TTL, run_id

from support.freeze import freeze, thaw
from support.live_agent import read_events

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from live_checks import REPO, TEST_OPTIONS, WORKER, assert_consistent, assert_no_redo, recoveries, steps  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.needs_torch]

FAULT_STEP = 25
STEP_SLEEP = 0.1
START = {"spawned": ["--no-prewarm"], "prewarm": []}
"""How a replacement starts: a fresh process, or (``--live-recovery``'s default) a fork of a
template that imported what the worker needs before its LiveTraining starts, so it only builds
its state."""


REJOIN = 0.2
"""``--rdzv-conf rejoin_timeout`` of the node-loss test: a lost node costs this, not the last call."""


def _agent(procs, etcd_server, rid: str, name: str, log: Path, total: int, *extra: str, conf: str = "",
           late_start: float = 0.0) -> agents.Launched:
    config = etcd_server.client_config()
    env = agents.clean_env(TMPDIR=str(procs.workdir), PYTHONPATH=str(REPO), LIVE_LOG=str(log), LIVE_SLOT=name,
                           LIVE_STEPS=str(total), LIVE_STEP_SLEEP=str(STEP_SLEEP), LIVE_OPTIONS=TEST_OPTIONS,
                           LIVE_CHECK="1", OMP_NUM_THREADS="1", LIVE_LATE_START_SLEEP=str(late_start))
    return procs.elasticrun(
        "--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "3", "--live-recovery", *extra,
        "--rdzv-backend", "etcd", "--rdzv-endpoint", etcd_server.endpoints, "--rdzv-id", rid,
        "--rdzv-conf", f"{FAST_CONF}{conf},user={config.user},password={config.password}", "--local-addr", "127.0.0.1",
        str(WORKER), name=name, env=env)


def _pids(log: Path) -> list[int]:
    return [event["pid"] for event in read_events(log) if event.get("ev") == "start"]


def _at_step(log: Path, step: int, world: int) -> bool:
    return any(event["step"] >= step and event["world"] == world for event in steps(read_events(log)))


def _longest_gap(events: list[dict], after: float, until: float = float("inf")) -> tuple[float, int]:
    """The longest time between two committed steps around and after ``after`` (the fault) and up
    to ``until``, and the step it ended at."""
    done = steps(events)
    pairs = [(b["t"] - a["t"], b["step"]) for a, b in zip(done, done[1:]) if after < b["t"] <= until]
    return max(pairs)


def _kill_stray_workers(*logs: Path) -> None:
    for log in logs:
        for pid in _pids(log):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("start", ["spawned", "prewarm"])
def test_a_crashed_worker_restarts_alone_and_heals_while_the_survivor_keeps_its_process(procs, etcd_server, tmp_path,
                                                                                      start):
    # The survivor does not wait for a fresh process's start (issue 37): enough steps that it joins before the end.
    total = 80 if start == "prewarm" else 200
    rid = run_id()
    logs = {name: tmp_path / f"{name}.jsonl" for name in ("a", "b")}
    try:
        for name, log in logs.items():
            _agent(procs, etcd_server, rid, name, log, total, *START[start])
        procs.wait_for("both workers past the fault step", lambda: all(_at_step(log, FAULT_STEP, 2) for log in logs.values()))
        [victim] = _pids(logs["b"])
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        assert [procs[name].wait(90) for name in ("a", "b")] == [0, 0], procs.logs()
    finally:
        _kill_stray_workers(*logs.values())
    a, b = read_events(logs["a"]), read_events(logs["b"])
    replacement = [event for event in b if event.get("ev") == "start"][-1]
    assert len(_pids(logs["a"])) == 1, "the survivor's worker was restarted"
    assert len(_pids(logs["b"])) == 2 and replacement["pid"] != victim
    assert_no_redo(a)
    assert [event["step"] for event in steps(a)][-1] == total - 1
    by_step = assert_consistent({"a": a, "b": b})  # equal checksums at the start of every step, both ranks
    assert sorted(by_step) == list(range(total))
    healed = [r for r in recoveries(b) if r["began"] > replacement["t"]][0]
    assert healed["role"] == "receiver" and healed["step"] > FAULT_STEP, healed
    first_after = [event for event in steps(b) if event["t"] > replacement["t"]][0]
    assert first_after["step"] == healed["step"]
    gap, at = _longest_gap(a, killed)
    ready = healed["began"] - killed  # the replacement's agent rejoin, process start and imports
    survivor = [r for r in recoveries(a) if (r["round"], r["generation"]) == (healed["round"], healed["generation"])][0]
    recovered = survivor["healed"] - healed["began"]  # the survivor's wait once the replacement was ready
    print(f"\nlive crash ({start}): survivor's longest step gap {gap:.2f}s (ending at step {at}), 0 steps redone; "
          f"replacement ready to form {ready:.2f}s after the kill; then both formed and healed in {recovered:.3f}s "
          f"({healed['nbytes']} bytes in {healed['healed'] - healed['formed']:.3f}s); the replacement's first step "
          f"{first_after['t'] - replacement['t']:.2f}s after its process start")
    assert recovered <= 0.5, f"the survivor re-formed {recovered:.2f}s after the replacement was ready to form"
    # Pre-warmed, the replacement is a fork with torch imported; started normally, the survivor
    # trains on alone while it imports: either way the survivor does not wait for its start.
    assert gap <= 0.5, f"the survivor's longest step gap was {gap:.2f}s"


@pytest.mark.parametrize("start", ["spawned", "prewarm"])
def test_a_lost_node_leaves_the_survivor_training_alone_and_heals_when_it_comes_back(procs, etcd_server, tmp_path,
                                                                                   start):
    # The survivor does not wait for a fresh process's start (issue 37): enough steps that it joins before the end.
    total = 200 if start == "prewarm" else 300  # a new node's template imports torch too
    extra = START[start]
    rid = run_id()
    logs = {name: tmp_path / f"{name}.jsonl" for name in ("a", "b", "b2")}
    try:
        for name in ("a", "b"):
            _agent(procs, etcd_server, rid, name, logs[name], total, *extra, conf=f",rejoin_timeout={REJOIN:g}")
        procs.wait_for("both workers past the fault step", lambda: all(_at_step(logs[n], FAULT_STEP, 2) for n in "ab"))
        killed = time.monotonic()
        procs["b"].kill_tree()
        procs.wait_for("the survivor to train alone", lambda: _at_step(logs["a"], FAULT_STEP + 5, 1), names=["a"])
        _agent(procs, etcd_server, rid, "b2", logs["b2"], total, *extra, conf=f",rejoin_timeout={REJOIN:g}")
        procs.wait_for("the node to come back and train", lambda: _at_step(logs["b2"], 0, 2), names=["a", "b2"])
        assert [procs[name].wait(90) for name in ("a", "b2")] == [0, 0], procs.logs()
    finally:
        _kill_stray_workers(*logs.values())
    a, b2 = read_events(logs["a"]), read_events(logs["b2"])
    assert len(_pids(logs["a"])) == 1, "the survivor's worker was restarted"
    assert_no_redo(a)
    worlds = [event["world"] for event in steps(a)]
    assert worlds[0] == 2 and 1 in worlds and worlds[-1] == 2, "the survivor did not train alone, then with the node"
    by_step = assert_consistent({"a": a, "b2": b2})
    assert sorted(by_step) == list(range(total))
    healed = recoveries(b2)[0]
    assert healed["role"] == "receiver" and healed["step"] > FAULT_STEP + 5, healed
    assert steps(b2)[0]["step"] == healed["step"]
    alone = [event for event in steps(a) if event["world"] == 1]
    loss_gap, _ = _longest_gap([event for event in steps(a) if event["t"] <= alone[0]["t"]], killed)
    back = steps(a)[len([event for event in steps(a) if event["t"] <= alone[-1]["t"]])]  # its first step with the node
    join_gap = back["t"] - alone[-1]["t"]
    lost, joined = (next(r for r in recoveries(a) if r["formed"] > moment) for moment in (killed, healed["began"]))
    # The survivor's collective fails at once and its worker says so: its agent joins the next
    # round then, not when the lost node's lease expires; that round closes when the rejoin
    # window (rejoin_timeout) passed without the lost node, not after the whole last call.
    alone_after = lost["healed"] - killed
    beyond = joined["healed"] - healed["began"]  # the survivor's wait once the joiner was ready to form
    print(f"\nlive node loss ({start}): survivor's step gap {loss_gap:.2f}s at the loss (re-formed alone {alone_after:.2f}s "
          f"after the kill; rejoin window {REJOIN:g}s, last call {LAST_CALL:g}s, lease TTL {LEASE_TTL:g}s), {join_gap:.2f}s when the node came back (re-formed and healed "
          f"{beyond:.3f}s after the joiner was ready to form), 0 steps redone; the returning node received "
          f"{healed['nbytes']} bytes in {healed['healed'] - healed['formed']:.3f}s")
    assert alone_after <= REJOIN + 0.5 < LAST_CALL, f"the survivor re-formed alone {alone_after:.2f}s after the loss"
    assert beyond <= 0.5, f"the survivor re-formed {beyond:.2f}s after the joiner was ready to form"
    if start == "prewarm":  # the joiner's agent joins once its templates imported: no import in the gap
        assert join_gap <= 0.5, f"the survivor's step gap was {join_gap:.2f}s when the node came back"


def test_a_frozen_node_is_left_behind_after_its_lease_and_heals_when_thawed(procs, etcd_server, tmp_path):
    total = 110
    rid = run_id()
    logs = {name: tmp_path / f"{name}.jsonl" for name in ("a", "b")}
    try:
        for name, log in logs.items():
            _agent(procs, etcd_server, rid, name, log, total)
        procs.wait_for("both workers past the fault step", lambda: all(_at_step(log, FAULT_STEP, 2) for log in logs.values()))
        tree = [process.pid for process in procs["b"].tree()]  # the agent, its worker, its store helper
        frozen = time.monotonic()
        for pid in tree:
            freeze(pid)
        try:
            procs.wait_for("the survivor to train alone", lambda: _at_step(logs["a"], FAULT_STEP + 5, 1), names=["a"])
        finally:
            for pid in tree:
                thaw(pid)
        thawed = time.monotonic()
        assert [procs[name].wait(90) for name in ("a", "b")] == [0, 0], procs.logs()
    finally:
        _kill_stray_workers(*logs.values())
    a, b = read_events(logs["a"]), read_events(logs["b"])
    assert len(_pids(logs["a"])) == 1 and len(_pids(logs["b"])) == 1, "a worker was restarted"
    assert_no_redo(a)
    assert [event["world"] for event in steps(a)][-1] == 2, "the thawed node did not train again"
    behind = [r for r in recoveries(b) if r["formed"] > thawed][0]
    assert behind["role"] == "receiver" and behind["step"] > FAULT_STEP + 5, behind
    # Frozen after its last collective of a step, the node commits that step when thawed, in the
    # group the survivor abandoned (the survivor redid it alone): it is behind, so the heal
    # overwrites it. Those steps are the only ones allowed to differ.
    stale = [e for e in steps(b) if e["t"] > frozen and e["round"] < behind["round"]]
    assert len(stale) <= 1 and all(e["step"] < behind["step"] for e in stale), stale
    by_step = assert_consistent({"a": a, "b": [e for e in b if e not in stale]})
    assert sorted(by_step) == list(range(total))
    lost = next(r for r in recoveries(a) if r["formed"] > frozen)
    alone_after = lost["healed"] - frozen
    gap, _ = _longest_gap([event for event in steps(a) if event["t"] <= lost["healed"] + 1.0], frozen)
    alone = [event for event in steps(a) if event["world"] == 1]
    back = next(event for event in steps(a) if event["t"] > alone[-1]["t"])
    print(f"\nlive freeze: survivor's step gap {gap:.2f}s at the freeze (re-formed alone {alone_after:.2f}s after "
          f"SIGSTOP; lease TTL {LEASE_TTL:g}s), {back['t'] - alone[-1]['t']:.2f}s when the thawed node rejoined, "
          f"0 steps redone; the thawed worker kept its process and received "
          f"{behind['nbytes']} bytes at step {behind['step']} ({len(stale)} step committed in the abandoned group "
          f"before the heal)")
    assert alone_after <= LEASE_TTL + 0.5, f"the survivor re-formed alone {alone_after:.2f}s after the freeze"


LATE_START = 10.0
"""Seconds a worker started after the job's first round sleeps before its LiveTraining starts."""


def _world_changes(events: list[dict]) -> list[int]:
    """The survivor's world sizes, each run of equal ones once."""
    worlds: list[int] = []
    for event in steps(events):
        if not worlds or worlds[-1] != event["world"]:
            worlds.append(event["world"])
    return worlds


def test_the_survivor_never_waits_for_a_worker_that_is_not_ready(procs, etcd_server, tmp_path):
    # Issue 37, its Done-when run: a worker crash whose replacement takes 10 s to be ready
    # (started normally, then a sleep before its LiveTraining, as a GPU's start-up), the node
    # killed and started again (its worker as slow), and that node's agent SIGTERMed. The
    # survivor re-forms without the missing worker at once each time, trains alone, and takes the
    # late worker in at a step boundary once it is ready; the late worker heals from it.
    total = 900  # the faults come on the survivor's progress; enough steps for all three
    rid = run_id()
    logs = {name: tmp_path / f"{name}.jsonl" for name in ("a", "b", "b2")}
    conf = f",rejoin_timeout={REJOIN:g}"
    slow = ("--no-prewarm",)

    def joined(name: str, after: float) -> bool:
        return any(e["t"] > after and e["world"] == 2 for e in steps(read_events(logs[name])))

    try:
        for name in ("a", "b"):
            _agent(procs, etcd_server, rid, name, logs[name], total, *slow, conf=conf,
                   late_start=LATE_START)
        procs.wait_for("both workers past the fault step", lambda: all(_at_step(logs[n], FAULT_STEP, 2) for n in "ab"))
        [victim] = _pids(logs["b"])
        crashed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        procs.wait_for("the replacement to train", lambda: joined("b", crashed), names=["a", "b"], timeout=120)
        lost = time.monotonic()
        procs["b"].kill_tree()
        alone = _last(logs["a"]) + 5
        procs.wait_for("the survivor to train alone", lambda: _at_step(logs["a"], alone, 1), names=["a"])
        restarted = time.monotonic()
        _agent(procs, etcd_server, rid, "b2", logs["b2"], total, *slow, conf=conf, late_start=LATE_START)
        procs.wait_for("the node to come back and train", lambda: joined("b2", restarted), names=["a", "b2"],
                       timeout=120)
        assert _last(logs["a"]) < total - 50, "the survivor finished before the third fault"
        terminated = time.monotonic()
        procs["b2"].terminate()
        assert [procs[name].wait(180) for name in ("a", "b2")] == [0, 128 + signal.SIGTERM], procs.logs()
    finally:
        _kill_stray_workers(*logs.values())
    a, b, b2 = (read_events(logs[name]) for name in ("a", "b", "b2"))
    assert len(_pids(logs["a"])) == 1, "the survivor's worker was restarted"
    assert_no_redo(a)
    by_step = assert_consistent({"a": a, "b": b, "b2": b2})
    assert sorted(by_step) == list(range(total))
    assert _world_changes(a) == [2, 1, 2, 1, 2, 1], _world_changes(a)
    late = [(name, [r for r in recoveries(events) if r["cause"] == "start"][-1])
            for name, events in (("b", b), ("b2", b2))]
    for name, first in late:
        assert first["role"] == "receiver" and first["generation"] >= 1, (name, first)  # it joined a later generation
    figures = []
    for what, at, until in (("crash", crashed, lost), ("node loss", lost, terminated), ("SIGTERM", terminated, 1e18)):
        alone = next(e for e in steps(a) if e["t"] > at and e["world"] == 1)
        gap, _ = _longest_gap(a, at, alone["t"] + 1.0)  # the fault's gap, the survivor's re-forming alone included
        back = [e for e in steps(a) if at < e["t"] <= until and e["world"] == 2]
        join = _longest_gap(a, back[0]["t"] - 1.0, back[0]["t"])[0] if back else None
        figures.append((what, gap, join))
        assert gap < LATE_START / 4, f"{what}: the survivor's longest step gap was {gap:.2f}s"
    late_ready = {name: first["began"] - start["t"] for (name, first), start in
                  zip(late, ([e for e in b if e.get("ev") == "start"][-1], [e for e in b2 if e.get("ev") == "start"][-1]))}
    print("\nlive, a worker not ready for 10 s: survivor's longest step gap "
          + "; ".join(f"{what} {gap:.2f}s" + ("" if join is None else f" (and {join:.2f}s when the late worker joined)")
                      for what, gap, join in figures)
          + f"; the late workers were ready to form {late_ready['b']:.1f}s and {late_ready['b2']:.1f}s after their start")


def _last(log: Path) -> int:
    done = steps(read_events(log))
    return done[-1]["step"] if done else -1
