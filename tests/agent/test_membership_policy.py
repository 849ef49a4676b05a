"""Membership policy with real agents on etcd: spares wait instead of churning, ranks are stable.

Each agent is ``python -m elastic.run`` in its own process with one gloo worker
(``tests/agent/workers/allreduce.py``); the helpers are ``e2e.py``, the fixtures ``procs`` and
``reports`` are in ``conftest.py``.
"""

from __future__ import annotations

import time

import pytest

import e2e
from elastic.testing.agents import clean_env

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.needs_torch]

SPARE_HOLD_S = 60.0
"""How long the members must train without a restart while a spare waits (issue 18)."""


def agent_of(agents, pid):
    """The launcher whose process tree holds worker ``pid``."""
    return next(agent for agent in agents if pid in {proc.pid for proc in agent.tree()})


def ranks_by_agent(records, agents, world, after=0.0):
    """Launcher name → the group rank its worker had in the first ``world``-sized group after ``after``."""
    out = {}
    for record in records:
        if record["event"] == "started" and record["world_size"] == world and record["time"] > after:
            try:
                out.setdefault(agent_of(agents, record["pid"]).name, record["group_rank"])
            except StopIteration:
                pass  # a worker of a killed node
    return out


def test_a_node_beyond_the_maximum_waits_as_a_spare_and_replaces_a_lost_member(procs, reports, etcd_server,
                                                                               tmp_path, record_property):
    stop_file = tmp_path / "stop"
    flags = ["--nnodes=1:2", "--nproc-per-node=1", "--max-restarts=0", *e2e.etcd_flags(etcd_server)]
    agents = [procs.elasticrun(*flags, *e2e.loop_args(reports, stop_file), name=f"node{index}")
              for index in range(2)]
    records = reports.wait_for("a world of 2", e2e.allreduces_at(2), agents)
    spare = procs.elasticrun(*flags, *e2e.loop_args(reports, stop_file), name="spare")
    agents.append(spare)
    held_from = time.time()
    deadline = time.monotonic() + SPARE_HOLD_S
    while time.monotonic() < deadline:
        for agent in agents:
            assert agent.proc.poll() is None, f"{agent.name} exited: {agent.stderr[-3000:]}"
        time.sleep(1.0)
    records = reports.all()
    started = [r for r in records if r["event"] == "started"]
    assert len(started) == 2, f"the members restarted while the spare waited: {started}"
    steps = [r for r in records if r["event"] == "allreduce" and r["time"] > held_from]
    assert len(steps) > 100, "the members did not train while the spare waited"
    assert "waits as a spare" in spare.stderr, spare.stderr[-3000:]

    victim = agent_of(agents, next(r["pid"] for r in started if r["group_rank"] == 0))
    old_world = e2e.worker_pids(records)
    killed_at = victim.kill_tree().at
    records = reports.wait_for("the spare in a world of 2",
                               e2e.allreduces_at(2, after=killed_at, not_by=old_world),
                               [a for a in agents if a is not victim])
    first = min(r["time"] for r in records
                if r["event"] == "allreduce" and r["time"] > killed_at and r["pid"] not in old_world)
    record_property("promotion_to_first_allreduce_s", round(first - killed_at, 3))
    print(f"spare promoted: first all-reduce {first - killed_at:.2f}s after the member's SIGKILL")
    after = ranks_by_agent(records, agents, 2, after=killed_at)
    assert after == {next(a.name for a in agents if a not in (victim, spare)): 0, "spare": 1}, after
    stop_file.touch()
    codes = [agent.wait() for agent in agents if agent is not victim]
    assert codes == [0, 0], [agent.stderr[-3000:] for agent in agents]


def test_survivors_keep_their_order_and_a_promoted_spare_gets_the_last_rank(procs, reports, etcd_server, tmp_path):
    stop_file = tmp_path / "stop"
    flags = ["--nnodes=1:3", "--nproc-per-node=1", "--max-restarts=0", *e2e.etcd_flags(etcd_server)]
    agents = [procs.elasticrun(*flags, *e2e.loop_args(reports, stop_file), name=f"node{index}")
              for index in range(3)]
    records = reports.wait_for("a world of 3", e2e.allreduces_at(3), agents)
    spare = procs.elasticrun(*flags, *e2e.loop_args(reports, stop_file), name="spare")
    agents.append(spare)
    before = ranks_by_agent(records, agents, 3)
    assert sorted(before.values()) == [0, 1, 2], before
    by_rank = {rank: name for name, rank in before.items()}
    reports.wait_for("the spare to wait", lambda _: "waits as a spare" in spare.stderr, agents)

    victim = next(agent for agent in agents if agent.name == by_rank[1])
    old_world = e2e.worker_pids(reports.all())
    killed_at = victim.kill_tree().at
    records = reports.wait_for("a world of 3 with the spare",
                               e2e.allreduces_at(3, after=killed_at, not_by=old_world),
                               [a for a in agents if a is not victim])
    after = ranks_by_agent(records, agents, 3, after=killed_at)
    assert after == {by_rank[0]: 0, by_rank[2]: 1, "spare": 2}, (before, after)
    stop_file.touch()
    codes = [agent.wait() for agent in agents if agent is not victim]
    assert codes == [0, 0, 0], [agent.stderr[-3000:] for agent in agents]


def test_a_node_whose_workers_keep_failing_is_excluded_and_the_job_goes_on(procs, reports, etcd_server, tmp_path):
    stop_file = tmp_path / "stop"
    flags = ["--nnodes=2:3", "--nproc-per-node=1", "--max-restarts=5", *e2e.etcd_flags(etcd_server)]
    conf_at = flags.index("--rdzv-conf") + 1
    flags[conf_at] += ",max_node_failures=2,exclusion_cooldown=300"
    args = [*e2e.loop_args(reports, stop_file), "--crash-if-env", "BAD_NODE", "--crash-after", "0.5"]
    agents = [procs.elasticrun(*flags, *args, name=f"good{index}") for index in range(2)]
    bad = procs.elasticrun(*flags, *args, name="bad", env=clean_env(BAD_NODE="1"))
    agents.append(bad)
    records = reports.wait_for("the bad node excluded and 2 nodes training",
                               lambda records: "is excluded for" in bad.stderr and e2e.allreduces_at(2)(records)
                               and len([r for r in records if r["event"] == "crash"]) >= 2,
                               agents, timeout=150)
    crashes = [r for r in records if r["event"] == "crash"]
    assert len(crashes) == 2, f"the bad node was not excluded after its 2nd failure in a row: {crashes}"
    excluded_at = max(r["time"] for r in crashes)
    reports.wait_for("the two good nodes training on", e2e.allreduces_at(2, after=excluded_at + 1.0), agents[:2])
    stop_file.touch()
    codes = [agent.wait() for agent in agents[:2]]
    assert codes == [0, 0], [agent.stderr[-3000:] for agent in agents]
    assert bad.wait(timeout=30) == 0, bad.stderr[-3000:]  # its cooldown wait sees the job end
    assert "max_node_failures=2" in bad.stderr and "the others go on without it" in bad.stderr
