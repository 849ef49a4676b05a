"""Memory of the store helper: one per agent (so per node), warm and serving.

Run:  python benchmarks/store_helper_memory.py [--clients 8] [--repetitions 3]

The helper (:mod:`elastic.agent.processes.store_host`) imports torch once and serves each
attempt's ``TCPStore`` on the master port. This starts it as the agent does, and reads its
``/proc/<pid>/smaps_rollup`` (RSS, and PSS: shared pages divided among the processes that map
them, so the helper's fair share of the torch libraries it shares with workers of the same
interpreter) twice:

  warm      torch imported, no store yet (every node from its start)
  serving   a TCPStore on a listening socket, ``--clients`` clients connected, one key each
            (the master node during an attempt)

and prints the medians in MiB. The clients run in this process, which imports torch too, so
the PSS figures are those of a node where one other process maps torch.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from elastic.agent.processes.store_host import StoreHost  # noqa: E402
from elastic.rendezvous.ports import reserve_port  # noqa: E402


def rollup(pid: int) -> dict[str, float]:
    """``Rss`` and ``Pss`` of ``pid`` in MiB."""
    values = {}
    with open(f"/proc/{pid}/smaps_rollup") as rollup_file:
        for line in rollup_file:
            name, _, rest = line.partition(":")
            if name in ("Rss", "Pss"):
                values[name] = int(rest.split()[0]) / 1024
    return values


def wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def measure(clients: int) -> dict[str, float]:
    import torch.distributed as dist

    host = StoreHost(sys.executable, os.environ)
    try:
        host.warm()
        pid = host.pid

        def ready() -> bool:
            host.poll()
            return host.ready

        wait(ready, 120, "the helper to import torch")
        time.sleep(0.5)  # let the import's transient allocations settle
        warm = rollup(pid)
        reservation = reserve_port("127.0.0.1")
        port = reservation.port
        host.serve(reservation.take(), "127.0.0.1")
        stores = [dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=30),
                                wait_for_workers=False) for _ in range(clients)]
        for index, store in enumerate(stores):
            store.set(f"key{index}", "x" * 64)
        wait(lambda: (host.poll(), host.serving == port)[1], 30, "the helper to serve")
        serving = rollup(pid)
        return {"warm RSS": warm["Rss"], "warm PSS": warm["Pss"], "serving RSS": serving["Rss"],
                "serving PSS": serving["Pss"]}
    finally:
        host.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8, help="TCPStore clients while serving (default 8)")
    parser.add_argument("--repetitions", type=int, default=3, help="helpers measured one after the other (default 3)")
    args = parser.parse_args()
    samples = [measure(args.clients) for _ in range(args.repetitions)]
    for sample in samples:
        print("  " + "  ".join(f"{name} {value:.1f}" for name, value in sample.items()), file=sys.stderr)
    print(f"store helper, median of {args.repetitions} (MiB; serving: {args.clients} clients):")
    for name in samples[0]:
        print(f"  {name:<12} {statistics.median(s[name] for s in samples):7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
