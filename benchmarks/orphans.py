"""Orphans: what a launcher's SIGKILL leaves behind, ``elasticrun`` against ``torchrun``; and
what the parent-death ``preexec_fn`` costs a worker spawn.

Run:  python benchmarks/orphans.py [--repetitions 5] [--nproc 2] [--spawns 300] [--json FILE]

kill   each repetition runs ``--standalone --nproc-per-node=N workers/grandchildren.py`` under
       both launchers; once every worker and its two grandchildren (a Popen child, a fork child)
       run, SIGKILLs the launcher alone and measures the time until each of those 3N processes
       is gone (polled every 2 ms; zombies count as gone), giving up after ``--linger`` seconds.
spawn  in this process (with the agent's modules imported, so the address space resembles the
       agent's), the median ``Popen`` call of ``/bin/true`` with and without
       :func:`elastic.agent.pdeathsig.parent_death_preexec` (a ``preexec_fn`` turns CPython's
       vfork into a fork); then the same spawns again while 4 threads churn logging, JSON and
       allocation, counting spawns that hang (a faulthandler timer aborts the run on a hang).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
WORKER = os.path.join(HERE, "workers", "grandchildren.py")
LAUNCHERS = {
    "elasticrun": [sys.executable, "-m", "elastic.run"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
}
START_TIMEOUT_S = 60.0
POLL_S = 0.002
HANG_ABORT_S = 120.0


def kill_once(name: str, nproc: int, linger: float, workdir: str) -> tuple[float | None, int]:
    """Seconds from the launcher's SIGKILL until its workers and grandchildren are all gone
    (None: some outlived ``linger``), and how many survived ``linger``."""
    out = os.path.join(workdir, f"{name}-{time.monotonic_ns()}.jsonl")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env["LOGLEVEL"] = "WARNING"
    argv = LAUNCHERS[name] + ["--standalone", f"--nproc-per-node={nproc}", WORKER, out, str(linger + 30)]
    proc = subprocess.Popen(argv, env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    procs: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(procs) < 3 * nproc:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{name}: the workers did not all start")
            time.sleep(0.05)
            if os.path.exists(out):
                with open(out) as reports:
                    lines = [json.loads(line) for line in reports if line.endswith("\n")]
                if len(lines) == nproc:
                    procs = [psutil.Process(pid) for line in lines for pid in line["pids"]]
        proc.kill()
        killed = time.monotonic()
        while time.monotonic() - killed < linger:
            if not [p for p in procs if _running(p)]:
                return time.monotonic() - killed, 0
            time.sleep(POLL_S)
        return None, len([p for p in procs if _running(p)])
    finally:
        proc.kill()
        proc.wait()
        for p in procs:
            if _running(p):
                p.kill()


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def spawn_costs(spawns: int) -> dict[str, float]:
    """Median Popen() seconds without and with the preexec_fn, then hangs under thread churn."""
    import elastic.launch.runner  # noqa: F401 - the agent's address space
    from elastic.agent.pdeathsig import parent_death_preexec

    def popen_s(preexec: bool) -> float:
        started = time.perf_counter()
        child = subprocess.Popen(["/bin/true"], start_new_session=True, close_fds=True,
                                 preexec_fn=parent_death_preexec() if preexec else None)
        took = time.perf_counter() - started
        child.wait()
        return took

    result = {}
    for preexec in (False, True, False, True):  # interleaved halves against drift
        key = "with_preexec_ms" if preexec else "without_preexec_ms"
        result.setdefault(key, []).extend(popen_s(preexec) for _ in range(spawns // 2))
    medians = {key: statistics.median(values) * 1000 for key, values in result.items()}

    stop = threading.Event()
    sink = logging.getLogger("bench-churn")
    sink.addHandler(logging.FileHandler(os.devnull))
    sink.propagate = False

    def churn() -> None:
        while not stop.is_set():
            sink.warning("churn %s", json.dumps({"x": list(range(50))}))
            _ = [bytearray(4096) for _ in range(20)]

    threads = [threading.Thread(target=churn, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    faulthandler.dump_traceback_later(HANG_ABORT_S, exit=True)  # a deadlocked child hangs Popen
    try:
        completed = sum(1 for _ in range(spawns) if popen_s(True) >= 0)
    finally:
        faulthandler.cancel_dump_traceback_later()
        stop.set()
        for thread in threads:
            thread.join()
    medians["churn_spawns_completed"] = completed
    medians["churn_spawns"] = spawns
    return medians


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repetitions", type=int, default=5, help="kills per launcher (default 5)")
    parser.add_argument("--nproc", type=int, default=2, help="workers per run (default 2)")
    parser.add_argument("--linger", type=float, default=5.0, help="seconds to wait for orphans (default 5)")
    parser.add_argument("--spawns", type=int, default=300, help="spawns per spawn measurement (default 300)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.repetitions < 1 or args.nproc < 1 or args.spawns < 2 or args.linger <= 0:
        parser.error("--repetitions and --nproc must be at least 1, --spawns at least 2, --linger positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    kills: dict[str, list[tuple[float | None, int]]] = {name: [] for name in LAUNCHERS}
    with tempfile.TemporaryDirectory(prefix="bench-orphans-") as workdir:
        for repetition in range(args.repetitions):
            order = list(LAUNCHERS) if repetition % 2 == 0 else list(reversed(LAUNCHERS))
            for name in order:
                kills[name].append(kill_once(name, args.nproc, args.linger, workdir))
    print(f"SIGKILL of the launcher, --nproc-per-node={args.nproc}, {3 * args.nproc} processes "
          f"(workers + 2 grandchildren each), {args.repetitions} runs each")
    for name, samples in kills.items():
        times = [t for t, _ in samples if t is not None]
        survivors = [n for t, n in samples if t is None]
        gone = (f"all gone after median {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms"
                if times else "never all gone")
        left = f"; {len(survivors)} run(s) left {max(survivors)} alive after {args.linger:g} s" if survivors else ""
        print(f"  {name:<11} {len(times)}/{len(samples)} runs: {gone}{left}")
    spawn = spawn_costs(args.spawns)
    print(f"Popen(/bin/true) median: {spawn['without_preexec_ms']:.2f} ms without the preexec_fn, "
          f"{spawn['with_preexec_ms']:.2f} ms with it")
    print(f"with 4 threads churning: {spawn['churn_spawns_completed']}/{spawn['churn_spawns']} spawns completed, "
          f"none hung")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"kills": kills, "spawn": spawn}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
