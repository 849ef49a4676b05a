"""The chaos suite's harness: a training job of real agents, and the pure reading of its records.

A :class:`ChaosJob` runs one job of two agents (``elasticrun`` or stock ``torchrun`` with our
``etcd-v3`` plugin), each with one gloo worker (``workers/train.py``) training N steps against
an etcd the test hurts. The workers' records (one file per attempt, see the worker's
docstring) are read by pure functions: :func:`spans` (one per attempt that formed a group),
:func:`overlaps`, :func:`longest_gap`, :func:`reform_seconds`, :func:`last_step`,
:func:`steps_redone` and :func:`worker_starts`; :func:`figures` gathers them for the report line of a scenario.

The agents are :class:`elastic.testing.agents.Launched` processes of one
:class:`~elastic.testing.agents.Job`. Every process a job starts is tracked by PID and start
time, its descendants too (a sampler thread walks each agent's tree every 0.2 s, and the records
name every worker), so :meth:`ChaosJob.leftovers` can say which outlived their agent, and
:meth:`ChaosJob.close` SIGKILLs (and SIGCONTs) whatever still runs, also when the test failed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import psutil

from elastic.testing import agents, with_stacks

HERE = Path(__file__).parent
TRAIN = HERE / "workers" / "train.py"
LIVE_TRAIN = HERE / "workers" / "live_train.py"

ELASTICRUN = "elasticrun"
ELASTICRUN_LIVE = "elasticrun-live"
"""``elasticrun --live-recovery`` with the LiveTraining worker (``workers/live_train.py``)."""
TORCHRUN = "torchrun"
LAUNCHERS = (ELASTICRUN, ELASTICRUN_LIVE, TORCHRUN)

LEASE_TTL = 3
RDZV_CONF = f"lease_ttl={LEASE_TTL},last_call_timeout=1"
TORCHRUN_CONF = f"{RDZV_CONF},join_timeout=60,read_timeout=30"


# -- records (pure) ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One line a worker wrote."""

    event: str
    attempt: str
    restart: int
    rank: int
    world: int
    node: str
    pid: int
    time: float
    step: int | None = None


def parse_records(lines: Iterable[str]) -> list[Record]:
    """Records from JSON lines; a torn last line (a worker killed mid-write) is skipped."""
    found = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        found.append(Record(row["event"], row["attempt"], int(row["restart"]), int(row["rank"]), int(row["world"]),
                            str(row["node"]), int(row["pid"]), float(row["time"]), row.get("step")))
    return sorted(found, key=lambda record: record.time)


def read_records(out_dir: Path) -> list[Record]:
    lines: list[str] = []
    for path in sorted(out_dir.glob("attempt-*.jsonl")):
        lines += path.read_text(errors="replace").splitlines()
    return parse_records(lines)


@dataclass(frozen=True)
class Span:
    """One attempt that formed a process group: who was in it and when it trained.

    ``first_step``/``last_step_time`` are None when it formed but finished no step.
    """

    attempt: str
    world: int
    ranks: frozenset[tuple[str, int]]
    """(node, rank) of every worker that wrote a record."""
    formed: float
    first_step: float | None
    last_step_time: float | None
    steps: tuple[int, int] | None
    """The first and last step number it finished."""

    @property
    def rank_numbers(self) -> frozenset[int]:
        return frozenset(rank for _, rank in self.ranks)


def spans(records: Iterable[Record]) -> list[Span]:
    """The attempts in the records, in the order they formed."""
    by_attempt: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        by_attempt[record.attempt].append(record)
    found = []
    for attempt, rows in by_attempt.items():
        steps = [row for row in rows if row.event == "step"]
        found.append(Span(
            attempt=attempt,
            world=rows[0].world,
            ranks=frozenset((row.node, row.rank) for row in rows),
            formed=min(row.time for row in rows),
            first_step=min((row.time for row in steps), default=None),
            last_step_time=max((row.time for row in steps), default=None),
            steps=(min(row.step for row in steps), max(row.step for row in steps)) if steps else None,
        ))  # fmt: skip
    return sorted(found, key=lambda span: span.formed)


def overlaps(found: list[Span]) -> list[str]:
    """Pairs of attempts that trained at the same time with a rank in common (split brain). Pure."""
    problems = []
    for index, one in enumerate(found):
        for other in found[index + 1:]:
            if one.first_step is None or other.first_step is None:
                continue
            at_once = one.first_step <= other.last_step_time and other.first_step <= one.last_step_time  # type: ignore[operator]
            common = one.rank_numbers & other.rank_numbers
            if at_once and common:
                problems.append(f"attempts {one.attempt} and {other.attempt} both trained ranks {sorted(common)} "
                                f"between {max(one.first_step, other.first_step):.2f} and "
                                f"{min(one.last_step_time, other.last_step_time):.2f}")  # type: ignore[type-var]
    return problems


def longest_gap(records: Iterable[Record]) -> float:
    """The longest time in which no worker finished a step (0 with fewer than two steps). Pure."""
    times = sorted(record.time for record in records if record.event == "step")
    return max((later - earlier for earlier, later in zip(times, times[1:])), default=0.0)


def reform_seconds(found: list[Span], since: float) -> float | None:
    """Seconds from ``since`` to the first step of an attempt that formed after it (None: none did)."""
    firsts = [span.first_step for span in found if span.formed > since and span.first_step is not None]
    return min(firsts) - since if firsts else None


def last_step(records: Iterable[Record]) -> int:
    """The highest step number any worker finished (0: none)."""
    return max((record.step for record in records if record.event in ("step", "done") and record.step), default=0)


def steps_redone(records: Iterable[Record]) -> int:
    """Steps trained more than once: the work a restart lost. Counted per rank (the most any rank
    repeated), not per attempt: under torchrun two nodes may disagree on the restart count and
    so write one attempt under two ids. Pure."""
    steps: dict[int, list[int]] = defaultdict(list)
    for record in records:
        if record.event == "step" and record.step is not None:
            steps[record.rank].append(record.step)
    return max((len(found) - len(set(found)) for found in steps.values()), default=0)


def worker_starts(records: Iterable[Record]) -> dict[str, int]:
    """Workers that formed a group, per node (1 = never restarted)."""
    pids: dict[str, set[int]] = defaultdict(set)
    for record in records:
        pids[record.node].add(record.pid)
    return {node: len(found) for node, found in sorted(pids.items())}


@dataclass(frozen=True)
class Figures:
    """What a scenario is judged and quoted by."""

    worlds: tuple[int, ...]
    """World size of each attempt that finished at least one step, in order."""
    empty_attempts: int
    """Attempts that formed a group but finished no step (torn down before training)."""
    restarts: dict[str, int]
    """Worker restarts per node (workers that formed a group, minus one)."""
    charged: int
    """The highest TORCHELASTIC_RESTART_COUNT any worker saw (restarts charged to --max-restarts)."""
    last_step: int
    longest_gap: float
    reform: float | None
    """Seconds from the fault to the first step of a new attempt (None: no new attempt)."""
    redone: int
    """Steps trained more than once (lost by a restart; the worker checkpoints every step)."""
    overlaps: tuple[str, ...]

    def line(self) -> str:
        reform = "-" if self.reform is None else f"{self.reform:.1f} s"
        restarts = ",".join(f"{node}:{count}" for node, count in self.restarts.items()) or "-"
        return (f"worlds {'->'.join(map(str, self.worlds)) or '-'}, restarts {restarts}, charged {self.charged}, "
                f"empty attempts {self.empty_attempts}, last step {self.last_step}, "
                f"longest step gap {self.longest_gap:.1f} s, re-form {reform}, steps redone {self.redone}")


def figures(records: list[Record], fault_at: float) -> Figures:
    """The figures of a run whose fault started at wall time ``fault_at``. Pure."""
    found = spans(records)
    starts = worker_starts(records)
    return Figures(
        worlds=tuple(span.world for span in found if span.first_step is not None),
        empty_attempts=sum(1 for span in found if span.first_step is None),
        restarts={node: count - 1 for node, count in starts.items()},
        charged=max((record.restart for record in records), default=0),
        last_step=last_step(records),
        longest_gap=longest_gap(records),
        reform=reform_seconds(found, fault_at),
        redone=steps_redone(records),
        overlaps=tuple(overlaps(found)),
    )


def common_problems(job: "ChaosJob", codes: dict, found: Figures, steps: int) -> list[str]:
    """What every chaos run must hold: agents exit 0, the last step reached, nothing left
    behind, no two attempts training a rank at once."""
    problems = []
    if any(code != 0 for code in codes.values()):
        problems.append(f"agents exited {codes} (None: still running), not all 0")
    if found.last_step != steps:
        problems.append(f"training reached step {found.last_step}, not {steps}")
    leftovers = job.leftovers()
    if leftovers:
        problems.append(f"processes outlived the job: {leftovers}")
    return problems + list(found.overlaps)


# -- processes ---------------------------------------------------------------------------------


def agent_env(node: str, gloo_ifname: str = "lo") -> dict[str, str]:
    """An agent's environment: :func:`elastic.testing.agents.clean_env` without ``CHAOS_*`` from
    outside, with one OpenMP thread, gloo on ``gloo_ifname``, unbuffered output and the node label."""
    env = {key: value for key, value in agents.clean_env().items() if not key.startswith("CHAOS_")}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=gloo_ifname, PYTHONUNBUFFERED="1", CHAOS_NODE=node)
    return env


@dataclass
class ChaosJob:
    """One training job of real agents; see the module docstring. Call :meth:`close` (a fixture does)."""

    launcher: str
    workdir: Path
    nnodes: str = "2"
    steps: int = 100
    step_seconds: float = 0.25
    max_restarts: int = 3
    extra_args: tuple[str, ...] = ()
    """More agent flags (``--prewarm ...``), before the script."""
    rdzv_conf: str = ""
    """More ``--rdzv-conf`` keys (``cacert=...,cert=...``), after the suite's own."""
    run_id: str = field(default_factory=lambda: f"chaos-{uuid.uuid4().hex[:10]}")

    def __post_init__(self) -> None:
        self.out_dir = self.workdir / "records"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.processes = agents.Job(self.workdir)
        self._seen: dict[int, psutil.Process] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="chaos-process-sampler", daemon=True)
        self._sampler.start()

    def argv(self, node: str, endpoints: str, local_addr: str) -> list[str]:
        """The agent's command line."""
        common = [f"--nnodes={self.nnodes}", "--nproc-per-node=1", f"--max-restarts={self.max_restarts}",
                  "--monitor-interval=0.2", f"--rdzv-id={self.run_id}", "--rdzv-backend=etcd-v3",
                  f"--local-addr={local_addr}", f"--log-dir={self.workdir / ('logs-' + node)}", *self.extra_args]
        more = f",{self.rdzv_conf}" if self.rdzv_conf else ""
        worker = LIVE_TRAIN if self.launcher == ELASTICRUN_LIVE else TRAIN
        script = [str(worker), str(self.out_dir), f"--steps={self.steps}", f"--step-seconds={self.step_seconds}"]
        if self.launcher in (ELASTICRUN, ELASTICRUN_LIVE):
            live = ["--live-recovery"] if self.launcher == ELASTICRUN_LIVE else []
            return [*with_stacks.command("elastic.run"), *common, *live, f"--rdzv-endpoint={endpoints}",
                    f"--rdzv-conf={RDZV_CONF}{more}", f"--event-log={self.workdir / (node + '.events.jsonl')}", *script]
        if self.launcher == TORCHRUN:
            plain = ",".join(item.split("://", 1)[-1] for item in endpoints.split(","))
            return [*with_stacks.command("torch.distributed.run"), *common, f"--rdzv-endpoint={plain}",
                    f"--rdzv-conf={TORCHRUN_CONF}{more}", *script]
        raise ValueError(f"Unknown launcher {self.launcher!r}.")

    @property
    def agents(self) -> dict[str, agents.Launched]:
        """The agents by node."""
        return self.processes.agents

    def start(self, node: str, endpoints: str, local_addr: str = "127.0.0.1", *, gloo_ifname: str = "lo",
              wrap=None) -> agents.Launched:
        """Start node ``node``'s agent; ``wrap(argv) -> argv`` runs it elsewhere (a namespace)."""
        argv = self.argv(node, endpoints, local_addr)
        if wrap is not None:
            argv = wrap(argv)
        agent = self.processes.start(node, argv, env=agent_env(node, gloo_ifname), cwd=self.workdir)
        self._track(agent.pid)
        return agent

    def rounds_joined(self, node: str) -> int:
        """``round_joined`` events in node ``node``'s event log (elasticrun only; 0 without one)."""
        event_log = self.workdir / f"{node}.events.jsonl"
        if self.launcher == TORCHRUN or not event_log.exists():
            return 0
        count = 0
        for line in event_log.read_text(errors="replace").splitlines():
            try:
                count += json.loads(line).get("event") == "round_joined"
            except ValueError:
                continue
        return count

    def records(self) -> list[Record]:
        return read_records(self.out_dir)

    def wait_records(self, predicate: Callable[[list[Record]], bool], timeout: float) -> bool:
        """Poll the records until ``predicate(records)``; False after ``timeout`` seconds."""
        try:
            return agents.wait_until(lambda: predicate(self.records()), timeout, "the records", 0.1)
        except agents.WaitTimeout:
            return False

    def wait_step(self, step: int, timeout: float) -> bool:
        """Wait until a worker finished ``step``; False on timeout or when every agent exited."""
        def reached_or_all_exited() -> bool:
            return (last_step(self.records()) >= step
                    or all(agent.proc.poll() is not None for agent in self.agents.values()))
        try:
            agents.wait_until(reached_or_all_exited, timeout, f"step {step}", 0.1)
        except agents.WaitTimeout:
            return False
        return last_step(self.records()) >= step

    def wait_exit(self, timeout: float) -> dict[str, int | None]:
        """Each agent's exit code (None: still running after ``timeout`` seconds in all; its
        threads' stacks are then collected, see :meth:`hang_stacks`)."""
        return self.processes.collect(timeout=timeout)

    def hang_stacks(self) -> str:
        """The threads and stacks of the agents that did not exit (:meth:`wait_exit` collected
        their native stacks and had them dump their Python stacks to their stderr)."""
        dumps = [f"--- agent {node} threads:\n{agent.hang}" for node, agent in self.agents.items() if agent.hang]
        for node, agent in self.agents.items():
            text = agent.stderr
            start = text.find("Thread 0x")
            if start == -1:
                start = text.find("Current thread 0x")
            if start != -1:
                dumps.append(f"--- agent {node} stacks:\n{text[start:start + 12000]}")
        return "\n".join(dumps)

    def leftovers(self, grace: float = 5.0) -> list[str]:
        """Processes this job started (agents, workers, helpers) still alive ``grace`` s after now."""
        for record in self.records():
            self._track(record.pid)
        deadline = time.monotonic() + grace
        while True:
            alive = [proc for proc in self._tracked() if _alive(proc)]
            if not alive or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        return [f"pid {proc.pid} ({_describe(proc)})" for proc in alive]

    def stderr_tails(self, chars: int = 2500) -> str:
        return "\n".join(f"--- {self.launcher} agent {node} (exit {agent.proc.poll()}) stderr tail:\n"
                         f"{agent.stderr[-chars:]}" for node, agent in self.agents.items())

    def close(self) -> None:
        """SIGKILL (and SIGCONT) every tracked process still running, agents first; stop the sampler."""
        self._stop.set()
        self._sampler.join(timeout=5)
        for record in self.records():
            self._track(record.pid)
        procs = self._tracked()
        for proc in procs:
            if _alive(proc):
                try:
                    proc.send_signal(signal.SIGKILL)
                    proc.send_signal(signal.SIGCONT)
                except psutil.Error:
                    pass
        psutil.wait_procs([proc for proc in procs if _alive(proc)], timeout=10)
        for agent in self.agents.values():
            try:
                agent.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    # -- tracking ----------------------------------------------------------------------------
    def _track(self, pid: int) -> None:
        with self._lock:
            if pid in self._seen:
                return
        try:
            proc = psutil.Process(pid)
            proc.create_time()
        except psutil.Error:
            return
        with self._lock:
            self._seen.setdefault(pid, proc)

    def _tracked(self) -> list[psutil.Process]:
        with self._lock:
            return list(self._seen.values())

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            for agent in list(self.agents.values()):
                try:
                    children = psutil.Process(agent.pid).children(recursive=True)
                except psutil.Error:
                    continue
                for child in children:
                    self._track(child.pid)


def _alive(proc: psutil.Process) -> bool:
    """Running and still the same process (not a reused PID, not a zombie)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _describe(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:160]
    except psutil.Error:
        return "?"

