"""One side of a live-recovery state transfer over a real gloo pair on loopback, with a hostile
source when asked; the receiver prints one JSON line of what it cost.

    python heal_peer.py CASE RANK PORT [--state-mb N] [--rounds N] [--max-state-bytes N]

Rank 0 sends (the hostile header of ``CASE``, or a real state for ``legit``), rank 1 receives
through :func:`elastic.worker.transfer.receive_state` and prints ``{"case", "outcome",
"error", "seconds", "rss_peak_mib", "gil_stall_s", "nbytes"}``: the outcome is ``ok`` or the
error's class; the peak is the growth of the process's high-water RSS during the receive; the
stall is the longest a 1 ms ticker thread (as the round watcher) waited to run. The source
exits when the receiver says it is done (a source whose chunks were never asked for does not
wait out gloo's timeout). Used by ``tests/security/test_heal_bounds.py`` and
``benchmarks/heal_hostile.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
from datetime import timedelta

import psutil
import torch
import torch.distributed as dist

from elastic.worker.codec import encode_state
from elastic.worker.guard import OpRegistry
from elastic.worker.transfer import MAGIC, WIRE_VERSION, receive_state

CASES = ("overlap", "long_shape", "chunk_1e15", "chunk_1e30", "many_chunks", "legit")


def hostile(case: str) -> tuple[bytes, list[torch.Tensor]]:
    """The header and the chunks a hostile source sends for ``case``."""
    if case == "overlap":  # an 8 KB header: 250 tensors over the same 4 MiB chunk, each cloned
        numel = 1 << 20
        tensors = [[0, 1, [numel - 1]] for _ in range(250)]
        header = {"v": 1, "skeleton": [{"$tensor": i} for i in range(250)], "chunks": [["float32", numel]],
                  "tensors": tensors}
        chunks = [torch.ones(numel)]
    elif case == "long_shape":  # a 1.2 MB header: one shape of 600,000 dimensions
        header = {"v": 1, "skeleton": {"$tensor": 0}, "chunks": [["float32", 4]], "tensors": [[0, 0, [2] * 600_000]]}
        chunks = [torch.ones(4)]
    elif case in ("chunk_1e15", "chunk_1e30"):
        numel = 10 ** int(case[-2:])
        header = {"v": 1, "skeleton": {"$tensor": 0}, "chunks": [["float32", numel]], "tensors": [[0, 0, [numel]]]}
        chunks = [torch.ones(4)]  # never asked for
    elif case == "many_chunks":  # a 16 MiB header of empty chunks: objects, not bytes
        count = 1_000_000
        header = {"v": 1, "skeleton": None, "chunks": [["bool", 0]] * count, "tensors": []}
        chunks = [torch.zeros(0, dtype=torch.bool)] * count
    else:
        raise ValueError(case)
    return json.dumps(header, separators=(",", ":")).encode(), chunks


def legit_state(state_mb: int) -> dict:
    """A model-like state of ~``state_mb`` MiB: large float32 tensors and 200 small ones."""
    torch.manual_seed(0)
    large = max(1, state_mb * (1 << 20) // (4 << 20))
    return {"large": [torch.randn(1 << 20) for _ in range(large)],
            "small": {f"b{i}": torch.randn(256) for i in range(200)}, "step": 7}


def source(case: str, state_mb: int, rounds: int, store: dist.Store, group: dist.ProcessGroup) -> None:
    if case == "legit":  # encoded once, before the first heal: the receiver times the transfer alone
        encoded = encode_state(legit_state(state_mb), 4 << 20)
        header, chunks = encoded.header, list(encoded.chunks)
    else:
        header, chunks = hostile(case)
    store.set("encoded", "1")
    for round_number in range(rounds if case == "legit" else 1):
        preamble = torch.tensor([MAGIC, WIRE_VERSION, len(header), len(chunks)], dtype=torch.int64)
        works = [dist.isend(t, 1, group=group) for t in (preamble, torch.frombuffer(bytearray(header), dtype=torch.uint8), *chunks)]
        store.wait([f"done{round_number}"], timedelta(seconds=300))
        if case != "legit":
            os._exit(0)  # sends the receiver never asked for stay pending
        if store.get(f"done{round_number}") == b"refused":
            os._exit(0)
        for work in works:
            work.wait()


def receiver(case: str, rounds: int, max_state_bytes: int | None, store: dist.Store, group: dist.ProcessGroup) -> None:
    results = []
    limits = {} if max_state_bytes is None else {"max_state_bytes": max_state_bytes}
    store.wait(["encoded"], timedelta(seconds=300))
    for round_number in range(rounds if case == "legit" else 1):
        stall, rss_max = [0.0], [0]
        stop = threading.Event()
        me = psutil.Process()

        def tick() -> None:
            last = time.monotonic()
            while not stop.wait(0.001):
                now = time.monotonic()
                stall[0] = max(stall[0], now - last)
                rss_max[0] = max(rss_max[0], me.memory_info().rss)
                last = time.monotonic()

        ticker = threading.Thread(target=tick, daemon=True)
        peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        rss_before = me.memory_info().rss
        ticker.start()
        started = time.monotonic()
        outcome, error, nbytes = "ok", "", 0
        try:
            received = receive_state(OpRegistry(0, "heal-peer"), group, 0, 16 * 1024 * 1024, **limits)
            nbytes = received.nbytes
        except Exception as exc:  # noqa: BLE001 - what escapes is the finding
            outcome, error = type(exc).__name__, str(exc)[:300]
        seconds = time.monotonic() - started
        stop.set()
        ticker.join()
        peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        peak = max(rss_max[0], me.memory_info().rss, peak_after if peak_after > peak_before else 0)
        results.append({"case": case, "outcome": outcome, "error": error, "seconds": round(seconds, 4),
                        "rss_peak_mib": round((peak - rss_before) / (1 << 20), 1),
                        "gil_stall_s": round(stall[0], 4), "nbytes": nbytes})
        received = None
        store.set(f"done{round_number}", "1" if outcome == "ok" else "refused")
        if outcome != "ok":
            break
    for result in results:
        print(json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=CASES)
    parser.add_argument("rank", type=int)
    parser.add_argument("port", type=int)
    parser.add_argument("--state-mb", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5, help="heals of a legit state")
    parser.add_argument("--max-state-bytes", type=int, default=None)
    args = parser.parse_args()
    store = dist.TCPStore("127.0.0.1", args.port, 2, args.rank == 0, timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=args.rank, world_size=2, timeout=timedelta(seconds=60))
    group = dist.group.WORLD
    if args.rank == 0:
        source(args.case, args.state_mb, args.rounds, store, group)
    else:
        receiver(args.case, args.rounds, args.max_state_bytes, store, group)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
