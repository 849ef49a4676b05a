"""Backend operation latency: the built-in TCP store and etcd v3 against torch's C++ TCPStore.

Run:  python benchmarks/backend_ops.py [--ops 2000] [--quick]

Measures, in one run and on loopback:
  get          read of one existing key
  put          unconditional write (torch: set)
  cas          uncontended conditional write (ours: put_if on the mod revision; torch: compare_set)
  cas16        16 threads racing conditional writes on one key: per-attempt latency and
               successful writes per second
  watch        put → watch event delivered to another client (torch has no watch: n/a)
  join         the rendezvous join as one nested txn (guarded by the round's mod revision and
               the closed key's absence: put my key, claim the closer if absent, count the
               round's keys, read the state prefix); torch has no transaction: n/a
  join16       16 threads joining at once with that txn: per-join latency, joins per second
and prints p50 / p99 in milliseconds, ops/s, the CPU time this process spent per operation
(for etcd that is the client alone, as the server is another process; for the built-in store it
includes the in-process server) and the ratio of each p50 to TCPStore's.
etcd is started from the local binary on free ports (or ETCD_ENDPOINTS when set).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from backends.api import ABSENT, KVBackend  # noqa: E402
from backends.txn import Compare, Put, Range, Txn  # noqa: E402


@dataclass(frozen=True)
class Measurement:
    """Latencies (seconds) of one operation on one backend, and its throughput."""

    latencies: tuple[float, ...]
    ops_per_second: float
    cpu_per_op: float
    """CPU seconds of this process (all threads) per operation."""

    def percentile(self, fraction: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def timed(operation: Callable[[int], object], count: int) -> Measurement:
    """Run ``operation(i)`` ``count`` times after a short warm-up; latency of each call."""
    for index in range(min(50, count)):
        operation(-index - 1)
    latencies = []
    started, cpu = time.perf_counter(), time.process_time()
    for index in range(count):
        begin = time.perf_counter()
        operation(index)
        latencies.append(time.perf_counter() - begin)
    return Measurement(tuple(latencies), count / (time.perf_counter() - started), (time.process_time() - cpu) / count)


def contended(attempt: Callable[[], bool], threads: int, per_thread: int) -> Measurement:
    """``threads`` threads each make ``per_thread`` attempts; throughput counts successes."""
    barrier = threading.Barrier(threads + 1)
    latencies: list[list[float]] = [[] for _ in range(threads)]
    wins = [0] * threads

    def run(slot: int) -> None:
        barrier.wait()
        for _ in range(per_thread):
            begin = time.perf_counter()
            won = attempt()
            latencies[slot].append(time.perf_counter() - begin)
            wins[slot] += bool(won)

    workers = [threading.Thread(target=run, args=(slot,)) for slot in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait()
    started, cpu = time.perf_counter(), time.process_time()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    attempts = threads * per_thread
    return Measurement(
        tuple(value for slot in latencies for value in slot), sum(wins) / elapsed, (time.process_time() - cpu) / attempts
    )


# -- our backends ------------------------------------------------------------------------------
def measure_kv(open_client: Callable[[], KVBackend], count: int) -> dict[str, Measurement]:
    """All seven measurements against a KVBackend; ``open_client`` opens a fresh client."""
    prefix = f"/bench/{uuid.uuid4().hex[:8]}/"
    results: dict[str, Measurement] = {}
    with open_client() as client:
        client.put(prefix + "read", b"x" * 64)
        results["get"] = timed(lambda i: client.get(prefix + "read"), count)
        results["put"] = timed(lambda i: client.put(prefix + "write", b"x" * 64), count)
        revision = [client.put(prefix + "cas", b"0")]

        def cas(i: int) -> None:
            result = client.put_if(prefix + "cas", b"x" * 64, revision[0])
            revision[0] = result.current.mod_revision

        results["cas"] = timed(cas, count)

        def attempt() -> bool:
            current = client.get(prefix + "contended").kv
            expected = current.mod_revision if current is not None else ABSENT
            return client.put_if(prefix + "contended", b"y", expected).applied

        results["cas16"] = contended(attempt, 16, max(count // 16, 10))
        results["watch"] = measure_watch(client, open_client, prefix + "watched/", max(count // 4, 50))
        join = join_recipe(client, prefix)
        results["join"] = timed(lambda i: join(i % 64), count)
        slots = iter(range(1 << 30))
        results["join16"] = contended(lambda: join(64 + next(slots) % 64), 16, max(count // 16, 10))
        client.delete_prefix(prefix)
    return results


def join_recipe(client: KVBackend, prefix: str) -> Callable[[int], bool]:
    """``join(slot)``: the rendezvous join txn for node ``slot`` of an open round under ``prefix``."""
    state, nodes = prefix + "state/", prefix + "nodes/"
    round_revision = client.put(state + "round", b"r" * 64)
    lease = client.grant(60).id

    def join(slot: int) -> bool:
        claim = state + "closer"
        return client.txn(Txn(
            (Compare.mod_revision(state + "round", round_revision), Compare.absent(state + "closed")),
            (Put(nodes + f"{slot:03d}", b"n" * 64, lease),
             Txn((Compare.absent(claim),), (Put(claim, b"c", lease),), (Range(claim),)),
             Range(nodes, prefix=True, count_only=True),
             Range(state, prefix=True)),
            (Range(state, prefix=True),),
        )).succeeded

    return join


def measure_watch(writer: KVBackend, open_client: Callable[[], KVBackend], prefix: str, count: int) -> Measurement:
    """Latency from just before a put to its event arriving at another client's watch."""
    latencies = []
    with open_client() as watcher, watcher.watch_prefix(prefix) as watch:
        writer.put(prefix + "warm", b"w")
        watch.get(timeout=5)
        started, cpu = time.perf_counter(), time.process_time()
        for index in range(count):
            begin = time.perf_counter()
            writer.put(prefix + "k", str(index).encode())
            events = watch.get(timeout=5)
            if not events:
                raise RuntimeError("A watch event did not arrive within 5 s.")
            latencies.append(time.perf_counter() - begin)
    return Measurement(tuple(latencies), count / (time.perf_counter() - started), (time.process_time() - cpu) / count)


# -- torch's TCPStore ---------------------------------------------------------------------------
def measure_torch_store(count: int) -> dict[str, Measurement] | None:
    """get / set / compare_set on torch.distributed.TCPStore (C++ server and client)."""
    try:
        from datetime import timedelta

        from torch.distributed import TCPStore
    except ImportError:
        print("torch is not installed: the TCPStore column is skipped (pip install torch==2.13.0)")
        return None
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    client = TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))
    value = b"x" * 64
    client.set("read", value)
    results = {
        "get": timed(lambda i: client.get("read"), count),
        "put": timed(lambda i: client.set("write", value), count),
    }
    client.set("cas", "0")
    results["cas"] = timed(lambda i: client.compare_set("cas", str(i), str(i + 1)), count)
    client.set("contended", "0")
    per_thread = threading.local()

    def attempt() -> bool:
        store = getattr(per_thread, "store", None)
        if store is None:
            store = per_thread.store = TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))
        current = store.get("contended")
        desired = str(int(current) + 1).encode()
        return store.compare_set("contended", current, desired) == desired

    results["cas16"] = contended(attempt, 16, max(count // 16, 10))
    return results


# -- report -------------------------------------------------------------------------------------
OPERATIONS = ("get", "put", "cas", "cas16", "watch", "join", "join16")


def report(columns: dict[str, dict[str, Measurement] | None]) -> None:
    baseline = columns.get("torch TCPStore") or {}
    print(f"\n{'operation':<8} {'backend':<16} {'p50 ms':>8} {'p99 ms':>8} {'ops/s':>9} {'cpu ms/op':>10} {'p50 / TCPStore':>15}")
    for operation in OPERATIONS:
        for name, results in columns.items():
            if not results or operation not in results:
                print(f"{operation:<8} {name:<16} {'n/a':>8}")
                continue
            measurement = results[operation]
            p50 = measurement.percentile(0.5)
            reference = baseline.get(operation)
            ratio = f"{p50 / reference.percentile(0.5):.2f}x" if reference else "-"
            print(f"{operation:<8} {name:<16} {p50 * 1e3:8.3f} {measurement.percentile(0.99) * 1e3:8.3f} "
                  f"{measurement.ops_per_second:9.0f} {measurement.cpu_per_op * 1e3:10.3f} {ratio:>15}")
    print("(cas16 ops/s counts successful writes; p50/p99 and cpu are per attempt;\n"
          " cpu is this process's CPU time: etcd's client alone, the built-in store's client and server)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000, help="operations per measurement (default 2000)")
    parser.add_argument("--quick", action="store_true", help="a short smoke run (200 operations)")
    args = parser.parse_args()
    count = 200 if args.quick else args.ops

    from backends.tcp.client import TcpStoreBackend
    from backends.tcp.config import TcpStoreConfig
    from backends.tcp.server import start_server
    from elastic.testing.etcd_server import EtcdServerOptions, start_etcd_server

    columns: dict[str, dict[str, Measurement] | None] = {}
    with ExitStack() as stack:
        columns["torch TCPStore"] = measure_torch_store(count)
        server = start_server("127.0.0.1", 0, token="bench")
        stack.callback(server.stop)
        columns["built-in store"] = measure_kv(
            lambda: TcpStoreBackend(TcpStoreConfig(server.endpoint, token="bench")), count
        )
        etcd = stack.enter_context(start_etcd_server(EtcdServerOptions()))
        columns["etcd v3"] = measure_kv(etcd.connect, count)
    report(columns)


if __name__ == "__main__":
    main()
