"""``examples/train_live.py`` under ``elasticrun --live-recovery`` on a real etcd, through every
fault of issue 37 in one run: 2 nodes x 2 workers (``--nnodes 1:2``); a worker of node b
SIGKILLed; node b's whole process tree SIGKILLed and the node started again; its agent then
SIGTERMed and the node started once more, so the run ends with its full world. Node a survives
everything.

Checked from outside only, as a user would: the final line of every rank (``rank R done: step
S, lr L, samples K, params P``) and the example's ``--record`` lines (one per committed step and
rank). The survivor's longest step gap around each fault is printed (``pytest -s``), not bounded.
"""

from __future__ import annotations

import collections
import itertools
import math
import os
import re
import signal
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from e2e import ELASTICRUN, FAST_CONF, run_id

from elastic.testing import agents
from elastic.worker.data_plan import epoch_order

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.needs_torch]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_live.py"
TEXT = REPO / "README.md"
"""The example's default text; its windows are 64 bytes (+ 1) and its loader's seed is 0."""
WINDOWS = (len(TEXT.read_bytes()) - 1) // 64
STEPS = 280
REJOIN = 0.2
PROGRESS = 8
"""Steps the survivor commits in a new world before the next fault."""
FINAL = re.compile(r"rank (\d+) done: step (\d+), lr (\S+), samples (\d+), params ([0-9a-f]{16})")


def start_node(job: agents.Job, etcd_server, rid: str, name: str, node: str) -> agents.Launched:
    config = etcd_server.client_config()
    conf = f"{FAST_CONF},rejoin_timeout={REJOIN:g},user={config.user},password={config.password}"
    env = agents.clean_env(TMPDIR=str(job.workdir), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return job.start(name, [
        *ELASTICRUN, "--nnodes", "1:2", "--nproc-per-node", "2", "--max-restarts", "5", "--live-recovery",
        "--rdzv-backend", "etcd", "--rdzv-endpoint", etcd_server.endpoints, "--rdzv-id", rid, "--rdzv-conf", conf,
        "--local-addr", "127.0.0.1", str(EXAMPLE), "--steps", str(STEPS), "--log-every", "20",
        "--record", str(job.workdir / "records"), "--checkpoint", str(job.workdir / f"{node}.pt"),
        "--checkpoint-every", "20"], env=env)


class Records:
    """The ranks' ``--record`` lines of one run; the pids read go to the job, which stops any
    still running at the end."""

    def __init__(self, job: agents.Job) -> None:
        self.job = job

    def all(self) -> list[dict]:
        records = [record for path in sorted((self.job.workdir / "records").glob("*.jsonl"))
                   for record in agents.read_json_lines(path)]
        self.job.worker_pids.update(record["pid"] for record in records)
        return records

    def workers_of(self, name: str) -> set[int]:
        """The pids of node ``name``'s workers that recorded a step (its live process tree's)."""
        return {record["pid"] for record in self.all()} & {process.pid for process in self.job[name].tree()}

    def of(self, pid: int, after: float = 0.0, world: int | None = None) -> list[dict]:
        """``pid``'s records after monotonic time ``after`` (in ``world`` only, if given)."""
        return [r for r in self.all() if r["pid"] == pid and r["t"] > after and world in (None, r["world"])]


def longest_gap(records: list[dict], start: float, end: float) -> tuple[float, int]:
    """The survivor's longest time between two committed steps, the later one within [start, end)."""
    pairs = [(b["t"] - a["t"], b["step"]) for a, b in itertools.pairwise(records) if start <= b["t"] < end]
    return max(pairs, default=(0.0, -1))


def check_records(records: list[dict]) -> dict[int, list[dict]]:
    """Every step 0..STEPS-1 committed once: at most one record per rank, all agreeing on the world,
    epoch, samples and parameters; every step's samples are the next of its epoch's order (so none
    is used twice or skipped). Returns the records by step."""
    by_step: dict[int, list[dict]] = collections.defaultdict(list)
    for record in records:
        by_step[record["step"]].append(record)
    assert sorted(by_step) == list(range(STEPS)), f"steps recorded: {sorted(by_step)}"
    position = (0, 0)  # (epoch, samples of it used)
    for step, group in sorted(by_step.items()):
        first = group[0]
        same = {(r["world"], r["epoch"], r["samples"], r["params"]) for r in group}
        assert len(same) == 1, f"step {step} was committed with different contents: {same}"
        ranks = [r["rank"] for r in group]
        assert len(ranks) == len(set(ranks)) and set(ranks) <= set(range(first["world"])), f"step {step}: ranks {ranks}"
        epoch, used = position
        assert first["epoch"] == epoch, f"step {step} is in epoch {first['epoch']}, its position in epoch {epoch}"
        expected = epoch_order(WINDOWS, 0, epoch, True)[used:used + first["samples"]]
        got = [index for r in group for index in r["used"]]
        assert len(got) == len(set(got)) and set(got) <= set(expected), f"step {step} used {got}, not {list(expected)}"
        if len(group) == first["world"]:
            assert sorted(got) == sorted(expected), f"step {step} used {sorted(got)}, not {sorted(expected)}"
        used += first["samples"]
        assert used <= WINDOWS, f"epoch {epoch} used {used} samples, of {WINDOWS}"
        position = (epoch + 1, 0) if used == WINDOWS else (epoch, used)
    return by_step


def test_the_live_example_trains_through_a_worker_kill_a_node_kill_and_an_agent_sigterm(etcd_server, tmp_path):
    rid = run_id()
    with agents.Job(tmp_path, timeout=120, worker_marker=str(REPO)) as job:  # stops every process by pid at the end
        records = Records(job)
        for node in "ab":
            start_node(job, etcd_server, rid, node, node)
        job.wait_for("4 ranks training", lambda: len({r["pid"] for r in records.all() if r["step"] >= 10}) == 4)
        survivors, b_workers = sorted(records.workers_of("a")), sorted(records.workers_of("b"))
        assert len(survivors) == 2 and len(b_workers) == 2, (survivors, b_workers)
        survivor = survivors[0]
        moments: dict[str, float] = {}  # what happened → when (monotonic, as the records' "t")

        def fault(what: str, action: Callable[[], object], world: int, names: list[str]) -> None:
            """Mark ``what`` and do it; then wait until the survivor committed PROGRESS steps in a
            world of ``world`` after it."""
            moments[what] = time.monotonic()
            action()
            job.wait_for(f"{PROGRESS} steps in a world of {world} after {what}",
                         lambda: len(records.of(survivor, moments[what], world)) >= PROGRESS, names=names)

        def start_b(name: str) -> None:
            start_node(job, etcd_server, rid, name, "b")
            job.wait_for(f"node b's workers ({name}) training (if the run ended first: more STEPS)",
                         lambda: records.workers_of(name), names=["a", name])

        def sigterm_b2() -> None:
            job["b2"].terminate()
            job["b2"].wait(30)

        def kill_worker() -> None:
            os.kill(b_workers[0], signal.SIGKILL)
            job.wait_for("node b's replacement worker", lambda: records.workers_of("b") - set(b_workers))

        # (1) a worker of node b SIGKILLed: a replacement heals from its peers
        fault("a worker SIGKILLed", kill_worker, 4, ["a", "b"])
        # (2) node b SIGKILLed (agent, workers, templates, store helper at once): node a trains on
        # alone; the node comes back (its workers load its checkpoint, then heal from node a)
        fault("node b SIGKILLed", job["b"].kill_tree, 2, ["a"])
        fault("node b back", lambda: start_b("b2"), 4, ["a", "b2"])
        # (3) node b's agent SIGTERMed: it stops its workers and leaves; the node comes back once more
        fault("agent b SIGTERMed", sigterm_b2, 2, ["a"])
        fault("node b back again", lambda: start_b("b3"), 4, ["a", "b3"])

        codes = job.collect(["a", "b3"], timeout=180)
        assert codes == {"a": 0, "b3": 0}, job.logs()
        seen = records.all()

    finals = [match.groups() for name in ("a", "b3") for match in FINAL.finditer(job[name].stdout)]
    assert sorted(int(final[0]) for final in finals) == [0, 1, 2, 3], finals
    assert len({final[1:] for final in finals}) == 1, f"the ranks' final lines differ: {finals}"
    _, step, _, samples, params = finals[0]
    by_step = check_records(seen)
    assert int(step) == STEPS and params == by_step[STEPS - 1][0]["params"]
    assert int(samples) == sum(group[0]["samples"] for group in by_step.values())
    for pid in survivors:  # node a's workers kept their processes to the end and committed no step twice
        done = [r["step"] for r in records.of(pid)]
        assert done == sorted(set(done)) and (done[0], done[-1]) == (0, STEPS - 1), f"node a's {pid} committed {done}"
    # A rank whose attempt of a step failed (a peer died) while a peer had already committed it is
    # healed past that step by the peer: it never records it; so does a rank killed after its
    # commit. That is the step a fault hit, one per fault.
    partial = sorted(step for step, group in by_step.items() if len(group) < group[0]["world"])
    assert len(partial) <= 3, f"steps not recorded by every rank of their world: {partial}"

    ends = [*moments.values(), math.inf]
    gaps = {what: longest_gap(records.of(survivor), start, end) for what, start, end in zip(moments, ends, ends[1:])}
    mine = records.of(survivor)
    paces = {world: [b["t"] - a["t"] for a, b in itertools.pairwise(mine) if a["world"] == b["world"] == world]
             for world in sorted({r["world"] for r in mine})}
    pace = {world: statistics.median(seconds) for world, seconds in paces.items() if seconds}  # a world of one step has none
    print(f"\ntrain_live example: {STEPS} steps, {by_step[STEPS - 1][0]['epoch']} epochs of {WINDOWS} windows "
          f"({samples} samples); median step {', '.join(f'{t:.3f}s at world {w}' for w, t in pace.items())}; "
          f"steps recorded by part of their world {partial}; agent b exited {job['b2'].returncode} on SIGTERM; "
          "survivor's longest step gap: " + "; ".join(f"{what} {gap:.2f}s (step {at})"
                                                      for what, (gap, at) in gaps.items()))
