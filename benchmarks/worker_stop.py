"""What stopping a worker group costs the agent when the host runs many unrelated processes.

Run:  python benchmarks/worker_stop.py [--unrelated 1000] [--repetitions 5] [--nproc 2] [--grace 1.0]
                                       [--json FILE]

Starts ``--unrelated`` ``sleep`` processes that have nothing to do with the workers, then, each
repetition, a :class:`~elastic.agent.processes.workers.WorkerGroup` of ``--nproc`` workers that each start
a grandchild and ignore SIGTERM, so ``stop(timeout=--grace)`` waits out the whole grace period
and then SIGKILLs. Measured per stop, in this process: the wall time of ``stop()`` and the CPU
time (``time.process_time``, every thread of the agent) spent during it. The CPU time is what
finding the workers' process trees costs: every process the agent looks at is a ``/proc``
read. Prints the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

from elastic.agent.processes.workers import GroupSettings, WorkerGroup  # noqa: E402
from elastic.config import Entrypoint, LaunchConfig  # noqa: E402
from elastic.rendezvous.api import RendezvousInfo  # noqa: E402

WORKER = """\
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen(["sleep", "600"])
open(os.path.join(sys.argv[1], f"ready.{os.environ['LOCAL_RANK']}"), "w").close()
while True:
    time.sleep(1)
"""
START_TIMEOUT_S = 30.0


def stop_once(workdir: str, attempt: int, nproc: int, grace: float) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one ``stop()`` of a started group of stubborn workers."""
    script = os.path.join(workdir, "worker.py")
    marks = os.path.join(workdir, f"marks-{attempt}")
    os.makedirs(marks)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc,
                          entrypoint=Entrypoint("script", script, (marks,)))
    info = RendezvousInfo(run_id="bench", round=0, group_rank=0, group_world_size=1,
                          master_addr="127.0.0.1", master_port=29999, members=())
    group = WorkerGroup(config, info, attempt=attempt, settings=GroupSettings(log_root=os.path.join(workdir, "logs")))
    group.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(os.listdir(marks)) < nproc:
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not start")
            time.sleep(0.02)
        wall, cpu = time.monotonic(), time.process_time()
        group.stop(timeout=grace)
        return time.monotonic() - wall, time.process_time() - cpu
    finally:
        group.stop(timeout=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--unrelated", type=int, default=1000)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--grace", type=float, default=1.0)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    unrelated = [subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL)
                 for _ in range(args.unrelated)]
    host_processes = sum(name.isdigit() for name in os.listdir("/proc")) if os.path.isdir("/proc") else None
    try:
        with tempfile.TemporaryDirectory(prefix="worker_stop_") as workdir:
            with open(os.path.join(workdir, "worker.py"), "w") as f:
                f.write(WORKER)
            results = [stop_once(workdir, k, args.nproc, args.grace) for k in range(args.repetitions)]
    finally:
        for proc in unrelated:
            proc.kill()
        for proc in unrelated:
            proc.wait()
    summary = {
        "unrelated_processes": args.unrelated,
        "host_processes": host_processes,
        "nproc": args.nproc,
        "grace_s": args.grace,
        "stop_wall_s_median": statistics.median(w for w, _ in results),
        "stop_cpu_s_median": statistics.median(c for _, c in results),
        "stop_cpu_s_all": [round(c, 4) for _, c in results],
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
