"""Rendezvous at scale: our engine on etcd and on the built-in TCP store against torch's dynamic
rendezvous on its c10d (TCPStore) backend, in one run, on one machine.

Run:  python benchmarks/rendezvous_scale.py [--sizes 8,32,64,128,256,512,1024] [--repeats 3]
                                            [--backends etcd,tcp,plugin,torch] [--procs 16] [--quick]

For each N, N simulated nodes (min = max = N) rendezvous once. Nodes are threads spread over
``--procs`` worker processes; every node has its own handler. Our nodes share one backend
client per process (one gRPC channel / one multiplexed store connection, as agents on one host
could); torch's nodes each have their own TCPStore client, because a TCPStore client blocks
other threads while it waits for a key and torch's rank exchange waits for one.

``plugin`` is our engine on etcd as stock torchrun sees it (``--rdzv-backend=etcd-v3``): the
torchrun adapter over each node's handler, built from torch's parameters as torch's registry
builds it, each with its own etcd connection as torchrun makes them (wrapped to count writes),
and a node's ``next_rendezvous`` returns once it has also opened the round's agent store (rank
0 hosts a TCPStore on the master port its join published; the others connect to it).

Measured per repetition: the time from the first node's ``next_rendezvous`` call to the last
one's return, the CPU seconds the worker processes and the server spent meanwhile (where the
time goes on a loaded machine), and the backend writes per node (ours: counted by a
:class:`~backends.counting.CountingBackend` around each node's backend: the lease grant, the join
transaction, the closer's close transaction; torch: calls of its backend's ``set_state``, i.e.
its compare-and-set attempts including heartbeats). The table shows the median over repetitions,
the writes per node (mean and max) and torch's median divided by ours.

Torch gets a per-N budget (``--torch-budget``, default 60 s) as its join timeout and is skipped
above 128 nodes unless ``--torch-all`` (measured here: at 256 nodes every node failed after
243 s). A repetition that does not finish in its budget prints "did not complete in X s".
Every repetition uses a fresh run id and namespace. Servers and worker processes are stopped
by PID at the end.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

ALL_SIZES = (8, 32, 64, 128, 256, 512, 1024)
QUICK_SIZES = (8, 64)
BACKENDS = ("etcd", "tcp", "plugin", "torch")
TORCH_DEFAULT_MAX_N = 128
LEASE_TTL = 10.0
"""Generous, so keepalives are rare (one per node every TTL/3) while 1024 nodes share 2 cores."""
OUR_BUDGET = 60.0
"""Join timeout of our nodes: far above the expected seconds, so a failure shows as such."""
REQUEST_TIMEOUT = 30.0
"""Per-request timeout of our clients: 1024 nodes on 2 cores starve the client processes, and a
request that times out fails its node; a slow round should show as slow, not as failed."""
START_DELAY = 0.3
"""Seconds between "go" being sent and the nodes starting, so every worker starts together."""


# -- results ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeResult:
    """One node's rendezvous as its worker saw it (times are CLOCK_MONOTONIC, shared by processes)."""

    index: int
    started: float
    finished: float
    rank: int | None
    world_size: int | None
    round: int | None
    writes: int
    error: str | None = None


@dataclass
class TrialResult:
    """One repetition of one backend at one size."""

    backend: str
    nodes: int
    elapsed: float | None  # None: did not complete
    writes_per_node: float = 0.0
    max_writes: int = 0
    budget: float = 0.0
    problem: str = ""
    per_node_p50: float | None = None
    client_cpu: float = 0.0  # CPU seconds of every worker process during the rendezvous
    server_cpu: float | None = None  # CPU seconds of the backend's server process over the same span


@dataclass
class Row:
    """The table row of one backend at one size."""

    backend: str
    nodes: int
    trials: list[TrialResult] = field(default_factory=list)
    skipped: str = ""

    @property
    def completed(self) -> list[TrialResult]:
        return [trial for trial in self.trials if trial.elapsed is not None]

    @property
    def median(self) -> float | None:
        """Median over repetitions, or None when any repetition did not complete."""
        if not self.trials or len(self.completed) < len(self.trials):
            return None
        return statistics.median(trial.elapsed for trial in self.completed)  # type: ignore[misc]


# -- the worker process ----------------------------------------------------------------------
class _OurNodes:
    """Our handlers in one worker process, sharing one backend client."""

    def __init__(self, kind: str, endpoint: str, token: str | None) -> None:
        if kind == "etcd":
            from backends.etcd import EtcdBackend, EtcdConfig

            self.backend = EtcdBackend(EtcdConfig(endpoints=endpoint, request_timeout=REQUEST_TIMEOUT))
        else:
            from backends.tcp.client import TcpStoreBackend
            from backends.tcp.config import TcpStoreConfig

            config = TcpStoreConfig(endpoint, token=token, request_timeout=REQUEST_TIMEOUT)
            self.backend = TcpStoreBackend(config).connect()
        self.backend.get("/")  # connect before the clock starts

    def make(self, spec: dict[str, Any], index: int) -> Any:
        from backends.counting import CountingBackend
        from elastic.rendezvous.handler import NodeSpec, RendezvousHandler
        from elastic.rendezvous.settings import RendezvousSettings

        settings = RendezvousSettings(
            spec["run_id"], spec["nodes"], spec["nodes"], join_timeout=spec["budget"],
            lease_ttl=LEASE_TTL, namespace=spec["namespace"],
        )
        node = NodeSpec("127.0.0.1", node_id=f"node{index:05d}")
        return RendezvousHandler(settings, CountingBackend(self.backend), node)

    def rendezvous(self, handler: Any) -> tuple[int, int, int, int]:
        info = handler.next_rendezvous()
        return info.group_rank, info.group_world_size, info.round, handler._backend.writes

    def release(self, handler: Any) -> None:
        handler.shutdown()

    def close(self) -> None:
        self.backend.close()


class _PluginNodes:
    """Our engine behind torch's ``RendezvousHandler`` interface: the torchrun adapter over our
    handler, with our ``--rdzv-conf`` parsing of torch's parameters (as torch's registry builds
    it, except that the etcd client is wrapped to count writes)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def make(self, spec: dict[str, Any], index: int) -> Any:
        from torch.distributed.elastic.rendezvous import RendezvousParameters

        from backends.counting import CountingBackend
        from backends.etcd import EtcdBackend, EtcdConfig
        from elastic.rendezvous.handler import NodeSpec, RendezvousHandler
        from elastic.rendezvous.torchrun_plugin import TorchrunRendezvousHandler, settings_from_params

        params = RendezvousParameters(
            "etcd-v3", self.endpoint, spec["run_id"], spec["nodes"], spec["nodes"], local_addr="127.0.0.1",
            join_timeout=str(spec["budget"]), lease_ttl=str(LEASE_TTL), namespace=spec["namespace"],
            request_timeout=str(REQUEST_TIMEOUT),
        )
        backend = CountingBackend(EtcdBackend(EtcdConfig(self.endpoint, request_timeout=REQUEST_TIMEOUT)),
                                  owns_inner=True)
        backend.get("/")  # connect before the clock starts
        ours = RendezvousHandler(settings_from_params(params), backend, NodeSpec("127.0.0.1"), owns_backend=True)
        return TorchrunRendezvousHandler(ours, "127.0.0.1")

    def rendezvous(self, handler: Any) -> tuple[int, int, int, int]:
        info = handler.next_rendezvous()
        ours = handler._handler
        return info.rank, info.world_size, ours._joining.last.record.round, ours._backend.writes

    def release(self, handler: Any) -> None:
        handler.shutdown()

    def close(self) -> None:
        pass


class _TorchNodes:
    """torch's DynamicRendezvousHandler on C10dRendezvousBackend, one TCPStore client per node."""

    def __init__(self, endpoint: str) -> None:
        host, port = endpoint.rsplit(":", 1)
        self.host, self.port = host, int(port)

    def make(self, spec: dict[str, Any], index: int) -> Any:
        from torch.distributed import TCPStore
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
            DynamicRendezvousHandler,
            RendezvousTimeout,
        )

        class CountingBackend(C10dRendezvousBackend):
            """Counts compare-and-set attempts (joins, heartbeats, retries after a lost race)."""

            writes = 0

            def set_state(self, state, token=None):  # type: ignore[no-untyped-def]
                self.writes += 1
                return super().set_state(state, token)

        budget = timedelta(seconds=spec["budget"])
        store = TCPStore(self.host, self.port, is_master=False, timeout=budget + timedelta(seconds=30),
                         wait_for_workers=False)
        backend = CountingBackend(store, spec["run_id"])
        handler = DynamicRendezvousHandler.from_backend(
            spec["run_id"], store, backend, spec["nodes"], spec["nodes"], local_addr="127.0.0.1",
            timeout=RendezvousTimeout(join=budget),
        )
        handler.counting_backend = backend
        return handler

    def rendezvous(self, handler: Any) -> tuple[int, int, int, int]:
        info = handler.next_rendezvous()
        return info.rank, info.world_size, handler._state_holder.state.round, handler.counting_backend.writes

    def release(self, handler: Any) -> None:
        # Stop the heartbeats only: torch's shutdown() is more contended compare-and-sets, and
        # the run id is never used again.
        handler._stop_heartbeats()

    def close(self) -> None:
        pass


def _run_nodes(nodes: Any, handlers: dict[int, Any], start_at: float, wait: float) -> list[NodeResult]:
    """Start every handler's rendezvous at ``start_at``; results of those done within ``wait`` s."""
    go = threading.Event()
    results: dict[int, NodeResult] = {}

    def node(index: int, handler: Any) -> None:
        go.wait()
        started = time.monotonic()
        try:
            rank, world, round_number, writes = nodes.rendezvous(handler)
            results[index] = NodeResult(index, started, time.monotonic(), rank, world, round_number, writes)
        except Exception as error:  # reported to the parent, which prints it
            results[index] = NodeResult(index, started, time.monotonic(), None, None, None, 0, repr(error)[:300])

    threads = [threading.Thread(target=node, args=item, daemon=True, name=f"node-{item[0]}")
               for item in handlers.items()]
    for thread in threads:
        thread.start()
    time.sleep(max(start_at - time.monotonic(), 0.0))
    go.set()
    deadline = time.monotonic() + wait
    for thread in threads:
        thread.join(timeout=max(deadline - time.monotonic(), 0.0))
    return list(results.values())


def _settle(window: float = 0.25, idle_share: float = 0.04, budget: float = 30.0) -> None:
    """Wait until this process is idle (or ``budget`` s), so one repetition's tail does not
    bill the next: N nodes leaving send every remaining member's watch N deletes (O(N^2)
    events at the end of a job), which clients may still be draining when the next starts."""
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        before = time.process_time()
        time.sleep(window)
        if time.process_time() - before < idle_share * window:
            return


def worker_main(conn: Connection, kind: str, endpoint: str, token: str | None) -> None:
    """A worker process: serves prepare / go / release / exit requests from the parent."""
    import logging

    logging.basicConfig(level=logging.ERROR)
    if kind == "torch":
        nodes: Any = _TorchNodes(endpoint)
    elif kind == "plugin":
        nodes = _PluginNodes(endpoint)
    else:
        nodes = _OurNodes(kind, endpoint, token)
    handlers: dict[int, Any] = {}
    conn.send(("ready", None))
    while True:
        op, payload = conn.recv()
        try:
            if op == "prepare":
                handlers = {index: nodes.make(payload, index) for index in payload["indices"]}
                conn.send(("prepared", len(handlers)))
            elif op == "go":
                cpu_before = time.process_time()
                results = _run_nodes(nodes, handlers, payload["start_at"], payload["wait"])
                cpu = time.process_time() - cpu_before
                conn.send(("results", ([asdict(result) for result in results], cpu)))
            elif op == "release":
                with ThreadPoolExecutor(8) as pool:
                    list(pool.map(nodes.release, handlers.values()))
                handlers = {}
                _settle()
                conn.send(("released", None))
            elif op == "exit":
                nodes.close()
                conn.send(("bye", None))
                return
        except Exception:
            conn.send(("error", traceback.format_exc()))


# -- the parent ------------------------------------------------------------------------------
class WorkerPool:
    """``procs`` worker processes for one backend; stopped by PID."""

    def __init__(self, kind: str, endpoint: str, token: str | None, procs: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.kind = kind
        self._workers: list[tuple[Any, Connection]] = []
        try:
            for _ in range(procs):
                parent, child = context.Pipe()
                process = context.Process(target=worker_main, args=(child, kind, endpoint, token), daemon=True)
                process.start()
                child.close()
                self._workers.append((process, parent))
            for _, conn in self._workers:
                self._expect(conn, "ready", 120)
        except BaseException:
            self.stop()
            raise

    @property
    def size(self) -> int:
        return len(self._workers)

    def trial(
        self, spec: dict[str, Any], wait: float, server_pid: int | None = None
    ) -> tuple[list[NodeResult], float, float | None] | None:
        """Run one rendezvous of ``spec["nodes"]`` nodes: the node results, the workers' CPU
        seconds, and the server's CPU seconds from "go" until every worker answered (not its
        work when the nodes leave afterwards, which is O(N^2) watch events).

        None when a worker did not answer in time.
        """
        shares = [list(range(slot, spec["nodes"], self.size)) for slot in range(self.size)]
        for (_, conn), indices in zip(self._workers, shares):
            conn.send(("prepare", {**spec, "indices": indices}))
        for _, conn in self._workers:
            self._expect(conn, "prepared", 120)
        start_at = time.monotonic() + START_DELAY
        server_before = _cpu_seconds(server_pid)
        for _, conn in self._workers:
            conn.send(("go", {"start_at": start_at, "wait": wait}))
        results: list[NodeResult] = []
        cpu = 0.0
        late = False
        for _, conn in self._workers:
            remaining = start_at + wait + 30 - time.monotonic()
            if not conn.poll(max(remaining, 0.1)):
                late = True
                break
            items, worker_cpu = self._expect(conn, "results", 1)
            results += [NodeResult(**item) for item in items]
            cpu += worker_cpu
        server_after = _cpu_seconds(server_pid)
        if late:
            return None
        server_cpu = None if server_before is None or server_after is None else server_after - server_before
        for _, conn in self._workers:
            conn.send(("release", None))
        for _, conn in self._workers:
            self._expect(conn, "released", 120)
        return results, cpu, server_cpu

    def stop(self) -> None:
        for process, conn in self._workers:
            if process.is_alive():
                try:
                    conn.send(("exit", None))
                except OSError:
                    pass
        for process, _ in self._workers:
            process.join(timeout=10)
            if process.is_alive():
                os.kill(process.pid, 9)
                process.join(timeout=5)
        self._workers = []

    @staticmethod
    def _expect(conn: Connection, tag: str, timeout: float) -> Any:
        if not conn.poll(timeout):
            raise RuntimeError(f"a worker did not answer {tag!r} within {timeout:g}s")
        got, payload = conn.recv()
        if got != tag:
            raise RuntimeError(f"a worker answered {got!r} instead of {tag!r}: {payload}")
        return payload


def judge(
    kind: str, nodes: int, budget: float, outcome: tuple[list[NodeResult], float, float | None] | None
) -> TrialResult:
    """Turn one repetition's node results into a TrialResult, checking ranks and world sizes."""
    if outcome is None:
        return TrialResult(kind, nodes, None, budget=budget, problem="workers did not answer")
    results, client_cpu, server_cpu = outcome
    failed = [result for result in results if result.error]
    done = [result for result in results if not result.error]
    writes = [result.writes for result in done]
    trial = TrialResult(kind, nodes, None, budget=budget, client_cpu=client_cpu, server_cpu=server_cpu,
                        writes_per_node=statistics.mean(writes) if writes else 0.0,
                        max_writes=max(writes, default=0))
    if failed or len(done) < nodes:
        first = failed[0].error if failed else "no result"
        trial.problem = f"{len(failed)} failed, {nodes - len(done)} not done (e.g. {first})"
        return trial
    if sorted(result.rank for result in done) != list(range(nodes)):  # type: ignore[type-var]
        trial.problem = "ranks are not exactly 0..N-1"
        return trial
    if {(result.world_size, result.round) for result in done} != {(nodes, done[0].round)}:
        trial.problem = "nodes disagree on the world size or round"
        return trial
    first_join = min(result.started for result in done)
    trial.elapsed = max(result.finished for result in done) - first_join
    trial.per_node_p50 = statistics.median(result.finished - result.started for result in done)
    return trial


class Servers:
    """The backends' servers: etcd (binary), an ``elastic-store`` process, a torch TCPStore process."""

    def __init__(self, stack: ExitStack) -> None:
        self._stack = stack
        self.pids: dict[str, int | None] = {}
        self.etcd_endpoint = ""
        """Server process of each backend (None when not a local process), for CPU accounting."""

    def etcd(self) -> tuple[str, None]:
        from elastic.testing.etcd_server import EtcdServerOptions, start_etcd_server

        server = start_etcd_server(EtcdServerOptions())
        self._stack.callback(server.close)
        self.pids["etcd"] = getattr(server, "pid", None)
        return server.endpoints, None

    def tcp(self) -> tuple[str, str]:
        token = secrets.token_hex(16)
        token_file = tempfile.NamedTemporaryFile("w", prefix="bench-store-token-", delete=False)
        token_file.write(token)
        token_file.close()
        self._stack.callback(os.unlink, token_file.name)
        command = [sys.executable, "-m", "backends.tcp.cli", "--host", "127.0.0.1", "--port", "0",
                   "--token-file", token_file.name, "--log-level", "WARNING"]
        return self._spawn("tcp", command, "elastic-store listening on "), token

    def plugin(self) -> tuple[str, None]:
        """The plugin runs on etcd: start one when the etcd rows did not."""
        endpoint, token = self.etcd()
        self.etcd_endpoint = endpoint
        return endpoint, token

    def torch(self) -> tuple[str, None]:
        script = (
            "import sys, signal, threading, datetime\n"
            "from torch.distributed import TCPStore\n"
            "store = TCPStore('127.0.0.1', 0, None, True, datetime.timedelta(seconds=600), wait_for_workers=False)\n"
            "print(f'torch TCPStore listening on 127.0.0.1:{store.port}', flush=True)\n"
            "stop = threading.Event()\n"
            "signal.signal(signal.SIGTERM, lambda *_: stop.set())\n"
            "stop.wait()\n"
        )
        return self._spawn("torch", [sys.executable, "-c", script], "torch TCPStore listening on "), None

    def _spawn(self, kind: str, command: list[str], marker: str) -> str:
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=root)
        self._stack.callback(_stop_process, process)
        self.pids[kind] = process.pid
        line = process.stdout.readline() if process.stdout else ""  # blocks until it listens (or dies)
        if not line.startswith(marker):
            raise RuntimeError(f"{command[:3]} did not start (said {line!r})")
        return line[len(marker):].strip()


def _stop_process(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        os.kill(process.pid, 15)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, 9)
            process.wait()


def _cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (None when it cannot be read)."""
    if pid is None:
        return None
    try:
        import psutil

        times = psutil.Process(pid).cpu_times()
    except Exception:  # gone, or no permission: the column shows "-"
        return None
    return times.user + times.system


def run_backend(kind: str, endpoint: str, token: str | None, sizes: list[int], args: argparse.Namespace,
                server_pid: int | None = None) -> list[Row]:
    rows: list[Row] = []
    pool: WorkerPool | None = None
    try:
        for nodes in sizes:
            row = Row(kind, nodes)
            rows.append(row)
            if kind == "torch" and nodes > TORCH_DEFAULT_MAX_N and not args.torch_all:
                row.skipped = f"skipped above {TORCH_DEFAULT_MAX_N} nodes (--torch-all to run)"
                print(f"  {kind:5} N={nodes:5}: {row.skipped}", flush=True)
                continue
            budget = args.torch_budget if kind == "torch" else OUR_BUDGET
            repeats = repeats_for(nodes, args)
            for repeat in range(repeats):
                if pool is None:
                    pool = WorkerPool(kind, endpoint, token, args.procs)
                run_id = f"bench-{kind}-{nodes}-{repeat}-{uuid.uuid4().hex[:8]}"
                spec = {"run_id": run_id, "namespace": f"/bench-{uuid.uuid4().hex[:10]}",
                        "nodes": nodes, "budget": budget}
                trial = judge(kind, nodes, budget, pool.trial(spec, budget + 5, server_pid))
                row.trials.append(trial)
                _report(trial, repeat, repeats)
                if trial.elapsed is None:
                    pool.stop()  # stuck threads must not slow down what follows
                    pool = None
                    break  # the median is "did not complete" anyway
                if kind in ("etcd", "tcp", "plugin"):
                    _drop_namespace(kind, endpoint, token, spec["namespace"])
    finally:
        if pool is not None:
            pool.stop()
    return rows


def repeats_for(nodes: int, args: argparse.Namespace) -> int:
    if nodes >= 1024 and args.large_repeats is not None:
        return args.large_repeats
    return args.repeats


def _drop_namespace(kind: str, endpoint: str, token: str | None, namespace: str) -> None:
    if kind in ("etcd", "plugin"):
        from backends.etcd import EtcdBackend

        backend: Any = EtcdBackend(endpoint)
    else:
        from backends.tcp.client import TcpStoreBackend
        from backends.tcp.config import TcpStoreConfig

        backend = TcpStoreBackend(TcpStoreConfig(endpoint, token=token))
    try:
        backend.delete_prefix(namespace + "/")
    finally:
        backend.close()


def _report(trial: TrialResult, repeat: int, repeats: int) -> None:
    label = f"  {trial.backend:5} N={trial.nodes:5} rep {repeat + 1}/{repeats}:"
    if trial.elapsed is None:
        print(f"{label} did not complete in {trial.budget:g} s ({trial.problem})", flush=True)
    else:
        server = "-" if trial.server_cpu is None else f"{trial.server_cpu:.2f}"
        print(f"{label} {trial.elapsed:7.3f} s, writes/node {trial.writes_per_node:.2f} (max {trial.max_writes}), "
              f"per-node median {trial.per_node_p50:.3f} s, CPU s: clients {trial.client_cpu:.2f} "
              f"server {server}", flush=True)


def print_table(rows: list[Row], sizes: list[int]) -> None:
    torch_rows = {row.nodes: row for row in rows if row.backend == "torch"}
    print()
    print(f"{'N':>5}  {'backend':7}  {'reps':>4}  {'median s':>10}  {'min-max s':>15}  {'writes/node':>13}  {'vs torch':>10}")
    for nodes in sizes:
        for row in (row for row in rows if row.nodes == nodes):
            if row.skipped:
                print(f"{nodes:>5}  {row.backend:7}  {'-':>4}  {'skipped':>10}")
                continue
            median = row.median
            spread = "-"
            if row.completed:
                times = [trial.elapsed for trial in row.completed]
                spread = f"{min(times):.3f}-{max(times):.3f}"  # type: ignore[type-var]
            shown = f"{median:.3f}" if median is not None else f"DNF>{row.trials[-1].budget:g}"
            writes = [trial.writes_per_node for trial in row.trials if trial.writes_per_node]
            max_writes = max((trial.max_writes for trial in row.trials), default=0)
            writes_text = f"{statistics.mean(writes):.2f} ({max_writes})" if writes else "-"
            print(f"{nodes:>5}  {row.backend:7}  {len(row.trials):>4}  {shown:>10}  {spread:>15}  {writes_text:>13}  "
                  f"{_versus(row, torch_rows.get(nodes)):>10}")
    print("\nwrites/node: mean over nodes (max of any node); vs torch: torch's median / this median "
          "('>' when torch did not complete: its budget / this median).")


def _versus(row: Row, torch_row: Row | None) -> str:
    if row.backend == "torch" or torch_row is None or torch_row.skipped or row.median is None:
        return "-"
    if torch_row.median is not None:
        return f"{torch_row.median / row.median:.1f}x"
    return f">{torch_row.trials[-1].budget / row.median:.0f}x"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(map(str, ALL_SIZES)), help="node counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions per size (median reported)")
    parser.add_argument("--large-repeats", "--large_repeats", dest="large_repeats", type=int, default=None,
                        help="repetitions at N >= 1024 (default: --repeats)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="any of etcd,tcp,torch")
    parser.add_argument("--procs", type=int, default=16, help="worker processes the nodes are spread over")
    parser.add_argument("--torch-budget", "--torch_budget", dest="torch_budget", type=float, default=60.0,
                        help="seconds torch may take per repetition (its join timeout)")
    parser.add_argument("--torch-all", "--torch_all", dest="torch_all", action="store_true",
                        help=f"also run torch above {TORCH_DEFAULT_MAX_N} nodes")
    parser.add_argument("--quick", action="store_true", help="sizes 8,64 with 1 repetition (CI smoke)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.repeats = ",".join(map(str, QUICK_SIZES)), 1
    args.size_list = [int(item) for item in args.sizes.split(",") if item.strip()]
    args.backend_list = [item.strip() for item in args.backends.split(",") if item.strip()]
    unknown = sorted(set(args.backend_list) - set(BACKENDS))
    if unknown or not args.backend_list:
        parser.error(f"unknown backend(s) {', '.join(unknown)}; choose from {', '.join(BACKENDS)}")
    if any(size < 1 for size in args.size_list) or args.repeats < 1 or args.procs < 1:
        parser.error("sizes, --repeats and --procs must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows: list[Row] = []
    print(f"rendezvous_scale: sizes {args.size_list}, {args.repeats} repetition(s), backends {args.backend_list}, "
          f"{args.procs} worker processes, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)
    with ExitStack() as stack:
        servers = Servers(stack)
        for kind in args.backend_list:
            if kind == "plugin" and "etcd" in servers.pids:
                endpoint, token = servers.etcd_endpoint, None  # the same etcd as the etcd rows
            else:
                endpoint, token = getattr(servers, kind)()
                if kind == "etcd":
                    servers.etcd_endpoint = endpoint
            print(f"{kind}: server at {endpoint}", flush=True)
            rows += run_backend(kind, endpoint, token, args.size_list, args,
                                servers.pids.get("etcd" if kind == "plugin" else kind))
    print_table(rows, args.size_list)
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (other work on this machine skews the times)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump([{**asdict(row), "median": row.median} for row in rows], out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
