"""A gloo worker: all-reduces ``rank + 1`` once, or in a loop, and reports each result.

    allreduce.py OUT [--loop] [--stop-file F] [--max-seconds S] [--interval S]
                     [--crash-rank R --crash-restart K --crash-after S] [--crash-if-env VAR]

Reports to OUT (JSON lines, see ``_report``): ``started`` (wall time taken before torch is
imported), ``allreduce`` after each collective (``iteration``, ``result``, ``expected`` =
``W(W+1)/2``), ``crash`` just before a deliberate ``exit(1)``, ``finished``.

``--loop`` keeps all-reducing until the stop file exists (every rank agrees in the same
collective, so all stop together) or ``--max-seconds`` pass. A dead peer breaks the collective
and the worker exits non-zero, as a real training would. ``--crash-rank R --crash-restart K``:
rank R exits 1 ``--crash-after`` seconds into the loop when ``TORCHELASTIC_RESTART_COUNT`` is K;
``--crash-if-env VAR``: every attempt crashes so on a node whose agent has VAR set (a bad node).
"""

from __future__ import annotations

import time

STARTED = time.time()

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402

from _report import report  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--loop", action="store_true")
    parser.add_argument("--stop-file")
    parser.add_argument("--max-seconds", type=float, default=90.0)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--crash-rank", type=int, default=-1)
    parser.add_argument("--crash-restart", type=int, default=0)
    parser.add_argument("--crash-after", type=float, default=0.0)
    parser.add_argument("--crash-if-env", help="crash on every attempt when this variable is set (a bad node)")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    report(args.out, "started", time=STARTED)
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    crashes = (rank == args.crash_rank and restart == args.crash_restart) or bool(
        args.crash_if_env and os.environ.get(args.crash_if_env))
    expected = world * (world + 1) // 2
    loop_started = time.monotonic()
    deadline = loop_started + args.max_seconds
    iteration = 0
    while True:
        stop = bool(args.stop_file and os.path.exists(args.stop_file)) or time.monotonic() >= deadline
        tensor = torch.tensor([float(rank + 1), float(stop)])
        dist.all_reduce(tensor)
        report(args.out, "allreduce", iteration=iteration, result=int(tensor[0]), expected=expected)
        iteration += 1
        if not args.loop or tensor[1] > 0:
            break
        if crashes and time.monotonic() - loop_started >= args.crash_after:
            report(args.out, "crash")
            os._exit(1)  # abrupt, like a segfaulting extension: no teardown of the process group
        time.sleep(args.interval)
    dist.destroy_process_group()
    report(args.out, "finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
