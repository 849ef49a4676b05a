"""Killing the etcd leader during a live recovery changes nothing the training sees (issue 29).

Two ``elasticrun --live-recovery --prewarm`` agents on a 3-member etcd cluster, one LiveTraining
worker each (``workers/live_train.py``: a small DDP model, gloo, CPU). Node b's worker is
SIGKILLed once both nodes finished step 25; in the ``leader-kill`` case the etcd leader is
SIGKILLed right after it, while the agents run the recovery (b's agent rejoins, a's agent joins
the round with it, the replacement is forked and heals from the survivor). Both cases assert the
same: the survivor keeps its process and redoes no step, the replacement heals from it, the job
takes exactly one recovery round (no group restart), the parameters are equal on both ranks at
every step, and both agents exit 0 with nothing left behind. The figures of both are printed, so
the leader kill's cost (if any) is the difference between the two lines.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

import chaoslib
import live_records
from chaoslib import ELASTICRUN_LIVE

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.etcd, pytest.mark.needs_torch, pytest.mark.timeout(300)]

STEPS = 60
FAULT_STEP = 25
STEP_SECONDS = 0.1
PREWARM = ("--prewarm", "--prewarm-modules", "torch,torch.distributed,torch._dynamo,elastic.worker.live")
"""A forked replacement has torch imported: the recovery takes a fraction of a second, so an
etcd election in its middle would show in the survivor's step gap."""


def _both_at(job: chaoslib.ChaosJob, step: int) -> bool:
    done = {record.node for record in job.records() if record.event == "step" and record.step >= step}
    return done == {"a", "b"}


@pytest.mark.parametrize("etcd_fault", ["none", "leader-kill"])
def test_a_live_recovery_is_the_same_when_the_etcd_leader_dies_in_it(etcd_fault, etcd_cluster_factory, job_factory,
                                                                      report_figures):
    cluster = etcd_cluster_factory(3)
    job = job_factory(ELASTICRUN_LIVE, nnodes="1:2", steps=STEPS, step_seconds=STEP_SECONDS, extra_args=PREWARM)
    job.start("a", cluster.endpoints())
    job.start("b", cluster.endpoints())
    if not job.wait_records(lambda records: _both_at(job, FAULT_STEP), 120):
        pytest.fail(f"the job did not reach step {FAULT_STEP} on both nodes within 120 s:\n{job.stderr_tails()}")
    leader = cluster.leader()  # asked before the crash: the kill follows it at once
    [victim] = {record.pid for record in job.records() if record.node == "b"}
    crashed = time.time()
    os.kill(victim, signal.SIGKILL)
    if etcd_fault == "leader-kill":
        cluster.kill(leader)
    killed = time.time()
    codes = job.wait_exit(90)
    records = job.records()
    rows = live_records.read_rows(job.out_dir)
    found = chaoslib.figures(records, crashed)

    survivor = [row for row in rows if row["node"] == "a"]
    replaced = [row for row in rows if row["node"] == "b" and row["pid"] != victim]
    heals = [row for row in replaced if row["event"] == "formed"]
    first = next((row for row in replaced if row["event"] == "step"), None)
    gap = chaoslib.longest_gap([r for r in records if r.node == "a" and r.time > crashed - 1])
    to_first = first["time"] - crashed if first else float("nan")
    began = heals[0]["worker_started"] - crashed if heals else float("nan")
    line = (f"live crash, etcd fault {etcd_fault:<11} exits {codes}: survivor's longest step gap {gap:.2f} s, "
            f"replacement forked {began:.2f} s and took its first step {to_first:.2f} s after the crash, "
            f"leader ({leader.name} of m0..m2, the agents' first endpoint m0) killed {killed - crashed:.3f} s after the "
            f"crash; {found.line()}")
    report_figures(line)
    print("\n" + line)
    print("\n".join(str({key: row.get(key) for key in ("node", "pid", "attempt", "generation", "cause", "role", "start")})
                    for row in rows if row["event"] == "formed"))

    problems = chaoslib.common_problems(job, codes, found, STEPS)
    problems += live_records.live_problems(rows, STEPS)
    if len({row["pid"] for row in survivor}) != 1:
        problems.append(f"the survivor's worker was restarted: pids {sorted({row['pid'] for row in survivor})}")
    if not heals or heals[0]["role"] != "receiver" or heals[0]["start"] < FAULT_STEP:
        problems.append(f"the replacement did not heal from the survivor: {heals[:1]}")
    elif etcd_fault == "leader-kill" and heals[0]["time"] <= killed:
        problems.append("the replacement formed before the leader was killed: the fault missed the recovery")
    elif etcd_fault == "leader-kill" and (heals[0]["attempt"], heals[0]["cause"]) != (survivor[0]["attempt"], "start"):
        # With etcd electing a leader the next round takes seconds: the replacement, started in
        # the round in use, re-forms it with the survivor through its store (a new generation).
        problems.append(f"the replacement did not re-form the round in use while etcd elected a leader: {heals[:1]}")
    senders = [row for row in survivor if row["event"] == "formed" and heals and row["attempt"] == heals[0]["attempt"]
               and row["generation"] == heals[0]["generation"]]
    if [row["role"] for row in senders] != ["source"]:
        problems.append(f"the survivor did not send the state in the replacement's round: {senders}")
    if found.worlds != (2, 2) or found.empty_attempts:
        problems.append(f"attempts trained with world sizes {found.worlds} ({found.empty_attempts} empty), "
                        "expected one recovery round: (2, 2)")
    rounds = (job.rounds_joined("a"), job.rounds_joined("b"))
    if rounds != (2, 2):
        problems.append(f"agents a, b joined {rounds} rounds, expected (2, 2): one recovery round")
    if found.charged != 1:
        problems.append(f"{found.charged} restart(s) charged to --max-restarts, expected 1 (the crash)")
    assert not problems, "\n".join(problems) + f"\n{line}\n" + job.stderr_tails() + job.hang_stacks()
