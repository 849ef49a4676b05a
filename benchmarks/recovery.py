"""Recovery time: from a membership or failure event to the first collective of the new group.

Run:  python benchmarks/recovery.py [--repetitions 3] [--quick] [--json FILE]

Every job is ``--nnodes 2:3 --nproc-per-node 1`` on loopback; each worker loops gloo
all-reduces (``tests/agent/workers/allreduce.py``) and notes each one's wall time. Cases:

  node_loss     3 nodes running; SIGKILL one whole node (agent and worker, not the store host)
                → first all-reduce of the 2 survivors
  node_freeze   3 nodes running; SIGSTOP one whole node (its lease expires; the survivors'
                collective hangs until their agents restart them) → first all-reduce of the 2
  worker_crash  2 nodes; one worker exits 1 on its first attempt (``--max-restarts 1``)
                → first all-reduce of the restarted group (the re-formed round closes
                when both members are back, without the last call)
  worker_crash_fixed  the same with ``--nnodes 2``: the round closes when both rejoin, so
                this is the restart itself (stop, rendezvous, start, gloo bootstrap)
  scale_up      2 nodes running; a third agent is started
                → first all-reduce at world size 3 (includes the third launcher's own start)
  scale_up_pause  the same job, measured as the running job sees it: its last all-reduce at
                world size 2 → first all-reduce at world size 3. The third node's start is
                not in it: the job keeps training until that node joins. With ``--prewarm`` a
                node joining a running job joins once its templates are ready.

Launchers, all with the same liveness budget (a silent node is dead after 2 s) and a 1 s last
call, in one run:

  elasticrun/etcd   ``--rdzv-backend etcd``  ``--rdzv-conf lease_ttl=2,last_call_timeout=1``
  elasticrun/etcd+prewarm  the same with ``--prewarm``: workers forked from templates that
                    imported torch (``elasticrun/c10d+prewarm`` likewise, on request)
  elasticrun/c10d   ``--rdzv-backend c10d``  (the first node hosts the built-in store), same conf
  torchrun/c10d     ``--rdzv-backend c10d``  ``--rdzv-conf last_call_timeout=1,
                    keep_alive_interval=1,keep_alive_max_attempt=2``, with
                    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: by default torchrun 2.13 workers
                    share the rendezvous store, and a restarted gloo group reads the previous
                    attempt's addresses and fails (pytorch/pytorch#135712); the default is
                    available as ``--launchers torchrun/c10d-shared-store`` (expect failures)

etcd comes from :mod:`elastic.testing.etcd_server` (``ETCD_TEST_BACKEND``: docker or the local
binary), or ``--etcd-endpoint`` for a running one without auth. Prints the median recovery per
case and launcher, and ours / torchrun. ``--quick`` (CI): one repetition of node_loss and
worker_crash.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable

import psutil
from elastic.testing.agents import kill_tree, process_tree
from elastic.testing.ports import free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "tests", "agent", "workers", "allreduce.py")
CASES = ("node_loss", "node_freeze", "worker_crash", "worker_crash_fixed", "scale_up", "scale_up_pause")
LAUNCHERS = ("elasticrun/etcd", "elasticrun/etcd+prewarm", "elasticrun/c10d", "torchrun/c10d")
PREWARM = "+prewarm"
OPTIONAL = ("elasticrun/c10d+prewarm",)
# torchrun as shipped: workers share the rendezvous TCPStore, so a restarted gloo group can read
# the previous attempt's addresses and fail (pytorch/pytorch#135712). Opt-in: it rarely recovers.
TORCHRUN_SHARED = "torchrun/c10d-shared-store"
LIVENESS_S = 2
LAST_CALL_S = 1
WAIT_S = 30.0  # per step; --timeout


def wait_for_port(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


@dataclass
class Job:
    """The agents of one measured job, their worker reports, and their cleanup."""

    launcher: str
    etcd_endpoint: str
    workdir: str
    max_restarts: int = 3
    worker_args: tuple[str, ...] = ()
    nnodes: str = "2:3"
    run_id: str = field(default_factory=lambda: f"bench-{uuid.uuid4().hex[:8]}")
    port: int = field(default_factory=free_port)
    agents: list[subprocess.Popen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reports = os.path.join(self.workdir, f"{self.run_id}.jsonl")
        self.stop_file = os.path.join(self.workdir, f"{self.run_id}.stop")

    def argv(self) -> list[str]:
        common = [f"--nnodes={self.nnodes}", "--nproc-per-node=1", f"--max-restarts={self.max_restarts}",
                  "--rdzv-id", self.run_id, "--local-addr", "127.0.0.1", "--monitor-interval", "0.1"]
        worker = [WORKER, self.reports, "--loop", "--stop-file", self.stop_file, "--max-seconds", "120",
                  *self.worker_args]
        ours_conf = f"lease_ttl={LIVENESS_S},last_call_timeout={LAST_CALL_S}"
        launcher = self.launcher.removesuffix(PREWARM)
        prewarm = ["--prewarm"] if self.launcher.endswith(PREWARM) else []
        if launcher == "elasticrun/etcd":
            head = ["-m", "elastic.run", "--rdzv-backend", "etcd", "--rdzv-endpoint", self.etcd_endpoint,
                    "--rdzv-conf", ours_conf, *prewarm]
        elif launcher == "elasticrun/c10d":
            head = ["-m", "elastic.run", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.port}",
                    "--rdzv-conf", ours_conf, *prewarm]
        else:
            conf = f"last_call_timeout={LAST_CALL_S},keep_alive_interval=1,keep_alive_max_attempt={LIVENESS_S}"
            head = ["-m", "torch.distributed.run", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", f"127.0.0.1:{self.port}", "--rdzv-conf", conf]
        return [sys.executable, *head, *common, *worker]

    def start_agent(self) -> float:
        """Start one more agent; returns its wall start time. The first one hosts any c10d store."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
        env["LOGLEVEL"] = "WARNING"
        if self.launcher == "torchrun/c10d":
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # torch's workaround for #135712
        log = open(os.path.join(self.workdir, f"{self.run_id}-agent{len(self.agents)}.log"), "wb")
        started = time.time()
        with log:
            self.agents.append(subprocess.Popen(self.argv(), cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                                stdout=log, stderr=log))
        if len(self.agents) == 1 and self.launcher.removesuffix(PREWARM).endswith("c10d"):
            wait_for_port(self.port, time.monotonic() + WAIT_S)
        return started

    def records(self) -> list[dict]:
        if not os.path.exists(self.reports):
            return []
        with open(self.reports) as reports:
            complete = reports.read().split("\n")[:-1]  # the last piece may be a line still being written
        return [json.loads(line) for line in complete if line.strip()]

    def wait_for(self, what: str, predicate: Callable[[list[dict]], object]):
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            found = predicate(self.records())
            if found:
                return found
            time.sleep(0.02)
        raise RuntimeError(f"{self.launcher}: no {what} within {WAIT_S:g}s (logs in {self.workdir})")

    def kill_agent(self, index: int) -> float:
        """SIGKILL agent ``index`` and all its descendants at once; returns the wall time."""
        killed = kill_tree(self.agents[index].pid)
        self.agents[index].wait(timeout=10)
        return killed.at

    def freeze_agent(self, index: int) -> float:
        """SIGSTOP agent ``index`` and all its descendants, as a machine that hangs; returns the
        wall time. :meth:`stop` kills them (SIGKILL works on stopped processes)."""
        tree = process_tree(self.agents[index].pid)
        frozen_at = time.time()
        for proc in tree:
            try:
                proc.send_signal(signal.SIGSTOP)
            except psutil.NoSuchProcess:
                pass
        return frozen_at

    def stop(self) -> None:
        """Let the workers stop together, give the agents a moment, then kill what is left (by PID)."""
        open(self.stop_file, "w").close()
        deadline = time.monotonic() + 20
        for agent in self.agents:
            try:
                agent.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for index, agent in enumerate(self.agents):
            if agent.poll() is None:
                self.kill_agent(index)
        for pid in {r["pid"] for r in self.records()}:
            try:
                proc = psutil.Process(pid)
                if WORKER in " ".join(proc.cmdline()):
                    proc.kill()
            except psutil.Error:
                pass


def allreduce_times(records: list[dict], world: int, after: float, pids: set[int] | None = None) -> list[float]:
    return [r["time"] for r in records
            if r["event"] == "allreduce" and r["world_size"] == world and r["time"] > after
            and (pids is None or r["pid"] in pids)]


def full_world(world: int, after: float = 0.0) -> Callable[[list[dict]], bool]:
    def seen(records: list[dict]) -> bool:
        ranks = {r["rank"] for r in records
                 if r["event"] == "allreduce" and r["world_size"] == world and r["time"] > after}
        return ranks == set(range(world))
    return seen


def node_loss(job: Job) -> float:
    for _ in range(3):
        job.start_agent()
    job.wait_for("world of 3", full_world(3))
    killed_at = job.kill_agent(2)
    job.wait_for("world of 2 after the kill", full_world(2, after=killed_at))
    return min(allreduce_times(job.records(), 2, killed_at)) - killed_at


def node_freeze(job: Job) -> float:
    for _ in range(3):
        job.start_agent()
    job.wait_for("world of 3", full_world(3))
    frozen_at = job.freeze_agent(2)
    try:
        job.wait_for("world of 2 after the freeze", full_world(2, after=frozen_at))
    finally:
        job.kill_agent(2)  # a frozen agent would never take the stop file
    return min(allreduce_times(job.records(), 2, frozen_at)) - frozen_at


def worker_crash(job: Job) -> float:
    for _ in range(2):
        job.start_agent()
    crash = job.wait_for("crash", lambda records: next((r for r in records if r["event"] == "crash"), None))

    def restarted(records: list[dict]) -> list[float]:
        new_pids = {r["pid"] for r in records if r["event"] == "started" and r["time"] > crash["time"]}
        times = allreduce_times(records, 2, crash["time"], new_pids)
        return times if len({r["rank"] for r in records if r["pid"] in new_pids and r["event"] == "allreduce"}) == 2 else []

    return min(job.wait_for("restarted group", restarted)) - crash["time"]


def scale_up(job: Job) -> dict[str, float]:
    """Both scale-up figures from one run: from the third agent's start, and the job's pause."""
    for _ in range(2):
        job.start_agent()
    job.wait_for("world of 2", full_world(2))
    joined_at = job.start_agent()
    job.wait_for("world of 3", full_world(3, after=joined_at))
    first = min(allreduce_times(job.records(), 3, joined_at))
    last_of_2 = max(t for t in allreduce_times(job.records(), 2, 0.0) if t < first)
    return {"scale_up": first - joined_at, "scale_up_pause": first - last_of_2}


RUNS: dict[str, tuple[str, ...]] = {"node_loss": ("node_loss",), "node_freeze": ("node_freeze",),
                                    "worker_crash": ("worker_crash",), "worker_crash_fixed": ("worker_crash_fixed",),
                                    "scale_up": ("scale_up", "scale_up_pause")}
"""Each run (one job) and the cases it measures."""


def runs_for(cases: list[str]) -> list[str]:
    """The runs that measure ``cases``, each once, in the order of :data:`RUNS`."""
    return [run for run, measured in RUNS.items() if set(measured) & set(cases)]


def measure(run: str, launcher: str, etcd_endpoint: str, workdir: str) -> dict[str, float]:
    """One run's figures by case; every process it started is gone when it returns."""
    if run in ("worker_crash", "worker_crash_fixed"):
        job = Job(launcher, etcd_endpoint, workdir, max_restarts=1,
                  worker_args=("--crash-rank", "1", "--crash-restart", "0", "--crash-after", "1.0"),
                  nnodes="2" if run == "worker_crash_fixed" else "2:3")
    else:
        job = Job(launcher, etcd_endpoint, workdir)
    try:
        if run == "scale_up":
            return scale_up(job)
        single: dict[str, Callable[[Job], float]] = {"node_loss": node_loss, "node_freeze": node_freeze,
                                                     "worker_crash": worker_crash, "worker_crash_fixed": worker_crash}
        return {run: single[run](job)}
    finally:
        job.stop()


def table(results: dict[tuple[str, str], list[float]], cases: list[str], launchers: list[str]) -> str:
    widths = {name: max(17, len(name) + 2) for name in launchers}
    header = f"{'case':<19}" + "".join(f"{name:>{widths[name]}}" for name in launchers)
    ours = [name for name in launchers if not name.startswith("torchrun")]
    if "torchrun/c10d" in launchers:
        header += "".join(f"{name.split('/')[1] + '/torchrun':>24}" for name in ours)
    lines = ["recovery: event -> first all-reduce of the new group, median seconds", header]
    for case in cases:
        medians = {name: statistics.median(results[case, name]) if results[case, name] else None for name in launchers}
        row = f"{case:<19}" + "".join(f"{medians[name]:>{widths[name]}.2f}" if medians[name] is not None
                                      else f"{'failed':>{widths[name]}}" for name in launchers)
        theirs = medians.get("torchrun/c10d")
        for name in ours if "torchrun/c10d" in launchers else []:
            ratio = medians[name] / theirs if medians[name] is not None and theirs else None
            row += f"{ratio:>23.2f}x" if ratio is not None else f"{'n/a':>24}"
        lines.append(row)
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repetitions", type=int, default=3, help="measurements per case and launcher (default 3)")
    parser.add_argument("--quick", action="store_true", help="one repetition of node_loss and worker_crash (CI)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"any of {','.join(CASES)}")
    parser.add_argument("--launchers", default=",".join(LAUNCHERS), help=f"any of {','.join(LAUNCHERS)}")
    parser.add_argument("--etcd-endpoint", help="a running etcd without auth (default: start one)")
    parser.add_argument("--timeout", type=float, default=WAIT_S,
                        help=f"seconds to wait for each step before a measurement counts as failed (default {WAIT_S:g})")
    parser.add_argument("--json", help="also write every measurement to this file")
    args = parser.parse_args(argv)
    args.cases = [c for c in args.cases.split(",") if c]
    args.launchers = [name for name in args.launchers.split(",") if name]
    if args.quick:
        args.repetitions, args.cases = 1, [c for c in args.cases if c in ("node_loss", "worker_crash")]
    unknown = set(args.cases) - set(CASES) | set(args.launchers) - set(LAUNCHERS) - {TORCHRUN_SHARED, *OPTIONAL}
    if unknown or args.repetitions < 1:
        parser.error(f"unknown case or launcher {sorted(unknown)}, or --repetitions < 1")
    return args


def main(argv: list[str] | None = None) -> int:
    global WAIT_S
    args = parse_args(argv)
    WAIT_S = args.timeout
    results: dict[tuple[str, str], list[float]] = {(c, name): [] for c in args.cases for name in args.launchers}
    failures = 0
    with ExitStack() as cleanup:
        endpoint = args.etcd_endpoint or ""
        if not endpoint and any(name.removesuffix(PREWARM) == "elasticrun/etcd" for name in args.launchers):
            sys.path.insert(0, REPO)
            from elastic.testing.etcd_server import EtcdServerOptions, start_etcd_server

            server = start_etcd_server(EtcdServerOptions())
            cleanup.callback(server.close)
            endpoint = server.endpoints
        workdir = tempfile.mkdtemp(prefix="bench-recovery-")
        for repetition in range(args.repetitions):
            for run in runs_for(args.cases):
                wanted = [case for case in RUNS[run] if case in args.cases]
                for launcher in args.launchers:
                    try:
                        figures = measure(run, launcher, endpoint, workdir)
                    except (RuntimeError, subprocess.TimeoutExpired) as error:
                        failures += 1
                        print(f"  run {repetition + 1} {run:<18} {launcher:<23} FAILED: {error}", file=sys.stderr)
                        continue
                    for case in wanted:
                        results[case, launcher].append(figures[case])
                        print(f"  run {repetition + 1} {case:<18} {launcher:<23} {figures[case]:.2f}s",
                              file=sys.stderr)
        print(table(results, args.cases, args.launchers))
    if failures:
        print(f"{failures} run(s) failed; agent logs and worker reports kept in {workdir}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({f"{case} {name}": values for (case, name), values in results.items()}, out, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
