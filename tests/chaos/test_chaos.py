"""Static stability under etcd and network faults, with real etcd, agents and gloo workers (issue 15).

Each scenario runs a job of 2 agents x 1 gloo worker (``workers/train.py``: 90 steps, an
all_reduce per step, resuming from its checkpoint after a restart) under ``elasticrun`` and under
stock ``torchrun`` with our ``etcd-v3`` plugin, both with ``--rdzv-conf
lease_ttl=3,last_call_timeout=1``, injects one fault once a worker finished step 10 (80 steps
still to train; 50 after a fault that is over at once), and asserts:

* both agents exit 0 and the training reaches its last step;
* no process the job started outlives it (agents, workers, helpers);
* no two attempts trained at once with a rank in common;
* the attempts that trained had exactly the expected world sizes (``(2,)``: no restart at all,
  as for leader kill and quorum loss, where every node stays alive), none formed and was torn
  down before a step, and no restart was charged to ``--max-restarts`` under ``elasticrun``
  (the ``TORCHELASTIC_RESTART_COUNT`` workers saw; every fault here is a membership or store
  event, never a worker's own failure); under ``elasticrun`` each agent joined the expected
  number of rounds (its event log).

The ``elasticrun-live`` rows run the same scenarios once more under ``elasticrun
--live-recovery`` with the LiveTraining worker (``workers/live_train.py``: a small DDP model, a
parameter checksum all-reduced at the start of every step, no checkpoint). The same verdict, and
in addition (``live_records``): every worker keeps its process (none fails here), each node
commits each step once and in order (or goes on from the step a heal brought it to), every step
starts with equal parameters on every rank, and every worker that committed a step ended it
with the same parameters.

Each run's figures (world sizes, worker restarts per node, charged restarts, longest time
without a finished step, time from the fault to the first step of a new attempt) are printed
in the session's "chaos figures" summary. Scenarios that fail on today's code are marked
``xfail(strict=True)`` with what happens today: the fix that makes one pass must remove its mark.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Callable

import grpc
import pytest
from etcd3 import etcdrpc

import chaoslib
import live_records
from chaoslib import ELASTICRUN, ELASTICRUN_LIVE, LEASE_TTL, TORCHRUN, ChaosJob

from support.etcd_cluster import EtcdCluster
from support.freeze import freeze
from support.netns import NamespaceLink

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.etcd, pytest.mark.needs_torch, pytest.mark.timeout(420)]

FAULT_STEP = 10
"""The fault comes once a worker finished this step: the job formed, and trains in step with its peer."""
STEPS = FAULT_STEP + 80
"""80 steps after the fault: the job trains through it and on after it is over (8 to 11 s after
this module's faults that last 5 to 8 s, 10 s after quorum-loss-30s)."""
STEPS_INSTANT = FAULT_STEP + 50
"""A fault that is over the moment it is injected (a leader killed, a record overwritten, the
job's keys deleted, a lease revoked) has 50 steps after it: 10 s, over 3 lease TTLs, as long as
the job trains on after the faults that last (above)."""
START_TIMEOUT = 120.0
"""Seconds for the job to reach the fault step (agents, torch imports and gloo on a busy 2-core box)."""


@dataclass(frozen=True)
class Timeline:
    """Wall times of a fault: when it started and when it was over (None: it stays)."""

    fault_at: float
    healed_at: float | None = None


@dataclass(frozen=True)
class Context:
    """What a fault can act on: the etcd cluster, the job, and the namespace link (partition only)."""

    cluster: EtcdCluster
    job: ChaosJob
    link: NamespaceLink | None = None


@dataclass(frozen=True)
class Scenario:
    """One fault and what a statically stable job does through it."""

    name: str
    inject: Callable[[Context], Timeline]
    etcd_members: int = 3
    nnodes: str = "2"
    step_seconds: float = 0.2
    worlds: tuple[int, ...] = (2,)
    """World sizes of the attempts that trained, in order."""
    rounds: tuple[int, int] = (1, 1)
    """Rounds each agent (a, b) joins (elasticrun's event log)."""
    alternative: tuple[tuple[int, ...], tuple[int, int]] | None = None
    """Another correct (worlds, rounds), where etcd itself may decide either way (leader pause)."""
    charged: int = 0
    """Restarts charged to --max-restarts under elasticrun (a fault that crashes a worker: 1)."""
    steps: int = STEPS
    """Steps the job trains (:data:`STEPS`, or :data:`STEPS_INSTANT`)."""

    def __str__(self) -> str:
        return self.name


# -- faults ------------------------------------------------------------------------------------


def kill_leader(ctx: Context) -> Timeline:
    leader = ctx.cluster.leader()
    at = time.time()
    ctx.cluster.kill(leader)
    return Timeline(at)


def lose_quorum(seconds: float) -> Callable[[Context], Timeline]:
    """SIGSTOP both followers of 3 for ``seconds``: the leader loses quorum and steps down (etcd's
    check-quorum), so nothing can expire; the leader elected afterwards extends every lease."""

    def inject(ctx: Context) -> Timeline:
        leader = ctx.cluster.leader()
        return pause_members(ctx, [member for member in ctx.cluster.members if member != leader], seconds)

    return inject


def pause_leader(seconds: float) -> Callable[[Context], Timeline]:
    """SIGSTOP the leader and one follower for ``seconds`` (a frozen leader: a VM pause, a stalled
    disk). The resumed leader may still lead, and then its lessor expires every lease whose TTL ran
    out while it was frozen: etcd's own word, so the members re-form once."""

    def inject(ctx: Context) -> Timeline:
        leader = ctx.cluster.leader()
        follower = next(member for member in ctx.cluster.members if member != leader)
        return pause_members(ctx, [leader, follower], seconds)

    return inject


def pause_members(ctx: Context, members: list, seconds: float) -> Timeline:
    at = time.time()
    for member in members:
        ctx.cluster.pause(member)
    try:
        time.sleep(seconds)
    finally:
        for member in members:
            ctx.cluster.resume(member)
    return Timeline(at, time.time())


def restart_single_member(ctx: Context) -> Timeline:
    """SIGKILL the only member; start it again on the same port and data after 5 s."""
    member = ctx.cluster.members[0]
    at = time.time()
    ctx.cluster.kill(member)
    time.sleep(5)
    ctx.cluster.start(member)
    return Timeline(at, time.time())


def stop_agent(ctx: Context) -> Timeline:
    """SIGSTOP agent b (not its worker) for 2 x TTL: its lease expires on the server."""
    pid = ctx.job.agents["b"].pid
    at = time.time()
    freeze(pid)
    try:
        time.sleep(2 * LEASE_TTL)
    finally:
        os.kill(pid, signal.SIGCONT)
    return Timeline(at, time.time())


SHRUNK_TIMEOUT = 60.0
"""Seconds a partition is held at most while waiting for the survivor to train alone."""


def partition_node(ctx: Context) -> Timeline:
    """Cut node b's namespace from the host (etcd and its peer) for 2 x TTL, and longer if need be
    until the survivor has trained a step alone (world 1), at most :data:`SHRUNK_TIMEOUT` s.

    The wait makes "the job shrinks" observable whatever the load: after the lease expires the
    survivor's new workers still import torch and form a group, which on a busy 2-core machine can
    take longer than the rest of a 2 x TTL cut (seen once: the world-1 workers were stopped for the
    rejoin before their first step). If it never trains alone, the link heals anyway and the
    world sizes give the verdict.
    """
    at = ctx.link.cut()
    time.sleep(2 * LEASE_TTL)
    ctx.job.wait_records(lambda records: any(r.event == "step" and r.world == 1 for r in records), SHRUNK_TIMEOUT)
    healed = ctx.link.heal(probe_port=ctx.cluster.members[0].client_port)
    return Timeline(at, healed)


GARBAGE = b"\x00not json{"


def state_key(job: ChaosJob) -> str:
    return f"/elastic/{job.run_id}/state/round"


def corrupt_round_state(ctx: Context) -> Timeline:
    """Overwrite the round record with garbage (what a stray client or a bad migration leaves)."""
    address = ctx.cluster.endpoints().split(",")[0].split("://", 1)[-1]
    at = time.time()
    with grpc.insecure_channel(address) as channel:
        etcdrpc.KVStub(channel).Put(etcdrpc.PutRequest(key=state_key(ctx.job).encode(), value=GARBAGE), timeout=10)
    return Timeline(at)


SCENARIOS = {
    "leader-kill": Scenario("leader-kill", kill_leader, steps=STEPS_INSTANT),
    "quorum-loss-8s": Scenario("quorum-loss-8s", lose_quorum(8)),
    "quorum-loss-30s": Scenario("quorum-loss-30s", lose_quorum(30), step_seconds=0.5),
    "leader-pause-8s": Scenario("leader-pause-8s", pause_leader(8), worlds=(2, 2), rounds=(2, 2),
                                alternative=((2,), (1, 1))),
    "single-member-restart": Scenario("single-member-restart", restart_single_member, etcd_members=1),
    "agent-sigstop": Scenario("agent-sigstop", stop_agent, worlds=(2, 2), rounds=(2, 2)),
    "partition": Scenario("partition", partition_node, etcd_members=1, nnodes="1:2", worlds=(2, 1, 2),
                          rounds=(3, 2)),
    "corrupt-state": Scenario("corrupt-state", corrupt_round_state, steps=STEPS_INSTANT),
}

# What happens on today's code (issue 15's baseline, measured on this branch = main at c92bd2f; the
# elasticrun-live rows: issue 29); each mark goes with the fix that makes its scenario pass.
# (scenario, launcher) -> (reason, strict)
TODAY: dict[tuple[str, str], tuple[str, bool]] = {
    ("partition", TORCHRUN): (
        "7 of 9 runs re-formed once more after growing back (worlds 2->1->2->2, a restart charged by torch's "
        "agent); 2 of 9 passed", False),
    ("single-member-restart", TORCHRUN): (
        "flaky, 1 of 3 full runs: torch's agent on one node trained to the last step but never exited "
        "(cause not found yet); not strict", False),
    ("corrupt-state", TORCHRUN): (
        "flaky, 1 of 3 full runs, in the same run as the hang above; not strict", False),
    ("leader-pause-8s", TORCHRUN): (
        "flaky, 1 of 5 full runs: re-formed twice (worlds 2->2->2), a restart charged by torch's agent (its "
        "worker failed before it saw the membership change, as in agent-sigstop); not strict", False),
    ("agent-sigstop", TORCHRUN): (
        "two re-formations (worlds 2->2->2, 6 of 6 runs) instead of one, a restart charged by torch's agent", True),
}


def cases(names: list[str]) -> list:
    params = []
    for name in names:
        for launcher in (ELASTICRUN, ELASTICRUN_LIVE, TORCHRUN):
            marks = []
            if (name, launcher) in TODAY:
                reason, strict = TODAY[(name, launcher)]
                issue = 29 if launcher == ELASTICRUN_LIVE else 15
                # raises=AssertionError: only the scenario's verdict may fail expectedly; a harness
                # failure (no etcd, no namespace, the job never reached the fault) stays a failure.
                marks.append(pytest.mark.xfail(strict=strict, raises=AssertionError, reason=f"issue {issue}: {reason}"))
            params.append(pytest.param(SCENARIOS[name], launcher, id=f"{name}-{launcher}", marks=marks))
    return params


# -- the run -----------------------------------------------------------------------------------


def run(scenario: Scenario, launcher: str, ctx_cluster: EtcdCluster, job: ChaosJob,
        report: Callable[[str], None], link: NamespaceLink | None = None) -> None:
    """Start both agents, inject the fault at :data:`FAULT_STEP`, wait for the end, report and judge."""
    job.start("a", ctx_cluster.endpoints(link.host_addr if link else "127.0.0.1"),
              link.host_addr if link else "127.0.0.1", gloo_ifname=link.host_if if link else "lo")
    if link is None:
        job.start("b", ctx_cluster.endpoints())
    else:
        job.start("b", ctx_cluster.endpoints(link.host_addr), link.ns_addr, gloo_ifname=link.ns_if,
                  wrap=link.command)
    if not job.wait_step(FAULT_STEP, START_TIMEOUT):
        pytest.fail(f"the job did not reach step {FAULT_STEP} within {START_TIMEOUT:.0f}s before the fault:\n"
                    f"{job.stderr_tails()}")
    timeline = scenario.inject(Context(ctx_cluster, job, link))
    budget = 90 + (scenario.steps - FAULT_STEP) * scenario.step_seconds * 3
    codes = job.wait_exit(budget)
    records = job.records()
    found = chaoslib.figures(records, timeline.fault_at)
    regrow = None
    if timeline.healed_at is not None and len(found.worlds) > 1:
        regrow = chaoslib.reform_seconds(chaoslib.spans(records), timeline.healed_at)
    extra = "" if regrow is None else f", re-form after heal {regrow:.1f} s"
    if timeline.healed_at is not None:
        extra += f", fault lasted {timeline.healed_at - timeline.fault_at:.1f} s"
    report(f"{scenario.name:<22} {launcher:<10} exits {codes}: {found.line()}{extra}")

    problems = judge(scenario, launcher, job, codes, found)
    if scenario.name == "corrupt-state":
        problems += judge_corrupt_state(job)
    assert not problems, ("\n".join(problems) + f"\nfigures: {found.line()}\n" + job.stderr_tails()
                          + job.hang_stacks())


def judge(scenario: Scenario, launcher: str, job: ChaosJob, codes: dict, found: chaoslib.Figures) -> list[str]:
    """Everything wrong with the run (empty: it behaved as a statically stable job must)."""
    problems = chaoslib.common_problems(job, codes, found, scenario.steps)
    expected = scenario.worlds, scenario.rounds
    if scenario.alternative is not None and found.worlds == scenario.alternative[0]:
        expected = scenario.alternative
    if found.worlds != expected[0]:
        problems.append(f"attempts trained with world sizes {found.worlds}, expected {expected[0]}")
    if found.empty_attempts:
        problems.append(f"{found.empty_attempts} attempt(s) formed and were torn down before a step")
    if launcher == ELASTICRUN_LIVE:
        problems += live_records.live_problems(live_records.read_rows(job.out_dir), scenario.steps)
        crashed = {node: scenario.charged if node == "b" else 0 for node in found.restarts}  # faults crash b's
        if found.restarts != crashed:
            problems.append(f"workers were restarted {found.restarts} times per node, expected {crashed} (the "
                            "crashed ones only): live recovery keeps every healthy worker's process")
    if launcher in (ELASTICRUN, ELASTICRUN_LIVE):
        if found.charged != scenario.charged:
            problems.append(f"{found.charged} restart(s) charged to --max-restarts, expected {scenario.charged}")
        rounds = (job.rounds_joined("a"), job.rounds_joined("b"))
        if rounds != expected[1]:
            problems.append(f"agents a, b joined {rounds} rounds, expected {expected[1]}")
    return problems


def judge_corrupt_state(job: ChaosJob) -> list[str]:
    """Corrupt state seen by a watch: one clear line naming the key per agent, no traceback."""
    problems = []
    key = state_key(job)
    for node, agent in job.agents.items():
        text = agent.stderr
        if "Traceback" in text:
            problems.append(f"agent {node} printed a traceback")
        if not any(key in line for line in text.splitlines()):
            problems.append(f"agent {node} printed no line naming {key}")
    return problems


@pytest.mark.parametrize(("scenario", "launcher"), cases(
    ["leader-kill", "quorum-loss-8s", "quorum-loss-30s", "leader-pause-8s", "agent-sigstop", "corrupt-state"]))
def test_a_three_member_etcd_fault_leaves_the_job_training(scenario, launcher, etcd_cluster_factory, job_factory,
                                                           report_figures):
    cluster = etcd_cluster_factory(scenario.etcd_members)
    job = job_factory(launcher, nnodes=scenario.nnodes, steps=scenario.steps, step_seconds=scenario.step_seconds)
    run(scenario, launcher, cluster, job, report_figures)


@pytest.mark.parametrize(("scenario", "launcher"), cases(["single-member-restart"]))
def test_a_single_etcd_restarted_after_5s_costs_no_restart(scenario, launcher, etcd_cluster_factory, job_factory,
                                                           report_figures):
    cluster = etcd_cluster_factory(1)
    job = job_factory(launcher, nnodes=scenario.nnodes, steps=scenario.steps, step_seconds=scenario.step_seconds)
    run(scenario, launcher, cluster, job, report_figures)


@pytest.mark.parametrize(("scenario", "launcher"), cases(["partition"]))
def test_a_node_cut_off_for_two_ttls_leaves_and_rejoins(scenario, launcher, netns_link, etcd_cluster_factory,
                                                        job_factory, report_figures):
    cluster = etcd_cluster_factory(1, client_hosts=(netns_link.host_addr,))
    job = job_factory(launcher, nnodes=scenario.nnodes, steps=scenario.steps, step_seconds=scenario.step_seconds)
    run(scenario, launcher, cluster, job, report_figures, link=netns_link)
