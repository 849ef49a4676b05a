"""Nodes start in any order (issue 26 item 5), under elasticrun and stock torchrun side by side.

Node B (``--rdzv-backend=c10d --rdzv-conf is_host=0``, the same flags under both launchers)
starts ``EARLY`` seconds before node A, whose address is the endpoint and which hosts the c10d
store. torch 2.13's c10d client keeps trying to connect until its ``read_timeout`` and the job
runs; ours must wait too (until the join timeout) instead of exiting at the first refused
connection. Under both launchers: B is still running when A starts, one world of 2 forms on A and
B and passes the harness's checks, and both agents exit 0. The c10d store needs no etcd.
"""

from __future__ import annotations

import time

import pytest

from harness import C10D, C10D_CONNECT_TIMEOUT, ELASTICRUN_C10D, Job
from test_differential import find, judge, run_scenario

pytestmark = [pytest.mark.slow, pytest.mark.needs_torch]

EARLY = 5.0
"""How long node B runs before the node that hosts the c10d store starts."""
LAUNCHERS = (ELASTICRUN_C10D, C10D)


def host_last(early_exit: dict[str, int | None]):
    """The scenario: B (``is_host=0``) starts, A (the host) ``EARLY`` s later; both run to the
    end. ``early_exit[launcher]`` gets B's exit code if it exited before A started (else None),
    and then A is not started."""
    def drive(job: Job) -> tuple[dict, dict]:
        # torchrun's client tries to connect for its read_timeout: longer than the harness's
        # (which bounds the store waits of a round), as the host starts EARLY s later.
        connect = f",read_timeout={C10D_CONNECT_TIMEOUT}" if job.launcher == C10D else ""
        b = job.start("B", 1, conf=f"is_host=0{connect}")
        until = time.monotonic() + EARLY
        while b.returncode is None and time.monotonic() < until:
            time.sleep(0.1)
        early_exit[job.launcher] = b.returncode
        if b.returncode is not None:
            return {"both nodes": None}, {"B": b.returncode, "A": None}
        job.start("A", 1)
        outcome = job.wait_exit()
        return {"both nodes": find(job.rows(), 2, nodes={"A", "B"})}, outcome.codes
    return drive


def test_a_c10d_node_started_before_the_host_waits_for_it_and_the_job_runs(tmp_path):
    early_exit: dict[str, int | None] = {}
    runs = {launcher: run_scenario(launcher, tmp_path, None, host_last(early_exit), nnodes="2", max_restarts=0,
                                   probe_args=["--steps", "3"], nproc_of={"A": 1, "B": 1})
            for launcher in LAUNCHERS}
    problems = []
    for launcher, run in runs.items():  # torchrun c10d is held to this too: it is what users expect
        found = []
        if early_exit[launcher] is not None:
            found.append(f"{launcher}: B exited {early_exit[launcher]} before the host started")
        if run.phases["both nodes"] is None:
            found.append(f"{launcher}: A and B never formed one world of 2")
        if run.codes != {"A": 0, "B": 0}:
            found.append(f"{launcher}: agents exited {run.codes}, expected 0 and 0")
        problems += [*found, run.logs] if found else []
    assert not problems, "\n\n".join(problems)
    judge(runs)  # every world that formed is consistent, and ours has torchrun's rank/world columns
    # What B said while it waited (ours only; torchrun's client waits silently).
    early = (tmp_path / ELASTICRUN_C10D / "B.stderr").read_text()
    waiting = [line for line in early.splitlines() if "waiting for the c10d store host" in line]
    assert waiting and all("(is_host=0): connection refused;" in line for line in waiting), early
