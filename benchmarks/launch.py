"""Launcher overhead: ``elasticrun`` against ``torchrun``, same flags, same run.

Run:  python benchmarks/launch.py [--repetitions 5] [--nproc 2] [--import-torch] [--json FILE]

Each repetition runs ``--standalone --nproc-per-node=N workers/noop.py`` under three launchers
(``python -m elastic.run``, the same with ``--prewarm``, and ``python -m torch.distributed.run``,
rotating which goes first) and measures, from the moment the launcher process is created:

  first worker    wall time until the first worker started (each noop worker notes its start
                  time before any import but json/os/sys): the launcher's own overhead
  all workers     until the last worker started
  completion      until the launcher exited (noop workers exit at once, so this adds the
                  launcher's teardown: exit barrier, store shutdown)
  CPU             user + system seconds of the launcher and of every process it reaped (its
                  workers, and our store helper and watchdog), from os.wait4: less sensitive
                  to the machine's load than the wall times
  agent peak RSS  the launcher process alone (psutil, sampled every 5 ms), workers excluded
  wait4 maxrss    ru_maxrss from os.wait4: the largest of the launcher and the workers it reaped
  templates RSS   the peak of the summed RSS of the ``--prewarm`` templates (the launcher's
                  children running ``elastic.agent.prewarm.template``); 0 for the others
  workers ready   with ``--import-torch``: until the last worker finished ``import torch``

and prints the medians, the ratio ours / torchrun of each, and the load average (1 min) before
and after the timed runs: the machine's other work slows every launcher, torchrun's longer run
the most. ``--import-torch`` is what a real
worker pays; without it the workers import nothing, and ``--prewarm`` waits for its templates'
torch import before the first fork.

Every launcher runs once, untimed, before the repetitions, with its bytecode cached under the
run's temporary directory (``PYTHONPYCACHEPREFIX``, even when ``PYTHONDONTWRITEBYTECODE`` is
set): an installed package has its ``.pyc`` files, and compiling the ~80 modules of a source
checkout on every start would add about 0.4 s to ours (torch's come compiled with its wheel).
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
from dataclasses import asdict, dataclass

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
NOOP = os.path.join(HERE, "workers", "noop.py")
LAUNCHERS = {
    "elasticrun": [sys.executable, "-m", "elastic.run"],
    "prewarm": [sys.executable, "-m", "elastic.run", "--prewarm"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
}
TEMPLATE_MARK = "elastic.agent.prewarm.template"
SAMPLE_S = 0.005
RUN_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Sample:
    """One launch: seconds from process creation, and memory in MiB."""

    first_worker_s: float
    all_workers_s: float
    completion_s: float
    cpu_s: float
    agent_peak_rss_mib: float
    wait4_maxrss_mib: float
    templates_rss_mib: float
    workers_ready_s: float


def templates_rss(agent: psutil.Process) -> int:
    """The summed RSS of the agent's template children (0 without --prewarm)."""
    total = 0
    try:
        children = agent.children()
    except psutil.Error:
        return 0
    for child in children:
        try:
            if TEMPLATE_MARK in " ".join(child.cmdline()):
                total += child.memory_info().rss
        except psutil.Error:
            pass
    return total


def launch_once(name: str, nproc: int, workdir: str, import_torch: bool = False) -> Sample:
    """Run one launcher to completion and measure it.

    Raises:
        RuntimeError: the launcher failed, timed out, or not every worker reported.
    """
    out = os.path.join(workdir, f"{name}-{time.monotonic_ns()}.jsonl")
    argv = LAUNCHERS[name] + ["--standalone", f"--nproc-per-node={nproc}", NOOP, out,
                              *(["--import", "torch"] if import_torch else [])]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_")) and k != "PYTHONDONTWRITEBYTECODE"}
    env["LOGLEVEL"] = "WARNING"
    env["PYTHONPYCACHEPREFIX"] = os.path.join(workdir, "pycache")
    started_wall, started = time.time(), time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    agent, peak, templates_peak, sampled = psutil.Process(proc.pid), 0, 0, 0
    deadline = started + RUN_TIMEOUT_S
    status = rusage = None
    while time.monotonic() < deadline:
        try:
            peak = max(peak, agent.memory_info().rss)
        except psutil.Error:
            pass
        if name == "prewarm" and sampled % 10 == 0:  # every ~50 ms: listing children costs more
            templates_peak = max(templates_peak, templates_rss(agent))
        sampled += 1
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(SAMPLE_S)
    else:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{name} did not finish within {RUN_TIMEOUT_S:g}s")
    completion = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4; keep Popen consistent
    stderr = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if proc.returncode != 0:
        raise RuntimeError(f"{name} exited {proc.returncode}: {stderr[-2000:]}")
    with open(out) as reports:
        records = [json.loads(line) for line in reports if line.strip()]
    starts = sorted(r["started"] for r in records)
    if len(starts) != nproc:
        raise RuntimeError(f"{name}: {len(starts)} of {nproc} workers reported")
    ready = max((r.get("ready", r["started"]) for r in records))
    return Sample(
        first_worker_s=starts[0] - started_wall,
        all_workers_s=starts[-1] - started_wall,
        completion_s=completion,
        cpu_s=rusage.ru_utime + rusage.ru_stime,  # the launcher's and its reaped children's
        agent_peak_rss_mib=peak / 2**20,
        wait4_maxrss_mib=rusage.ru_maxrss / 1024,  # KiB on Linux
        templates_rss_mib=templates_peak / 2**20,
        workers_ready_s=ready - started_wall,
    )


def median_of(samples: list[Sample], field: str) -> float:
    return statistics.median(getattr(sample, field) for sample in samples)


def report(results: dict[str, list[Sample]], nproc: int, repetitions: int, import_torch: bool = False,
           load: tuple[float, float] | None = None) -> str:
    rows = [("first worker started (s)", "first_worker_s", "{:.3f}"),
            ("all workers started (s)", "all_workers_s", "{:.3f}"),
            *([("workers ready, torch imported (s)", "workers_ready_s", "{:.3f}")] if import_torch else []),
            ("completion (s)", "completion_s", "{:.3f}"),
            ("CPU, user + sys (s)", "cpu_s", "{:.3f}"),
            ("agent peak RSS (MiB)", "agent_peak_rss_mib", "{:.1f}"),
            ("templates peak RSS (MiB)", "templates_rss_mib", "{:.1f}"),
            ("wait4 maxrss (MiB)", "wait4_maxrss_mib", "{:.1f}")]
    worker = "noop.py --import torch" if import_torch else "noop.py"
    loads = f", load average {load[0]:.2f} before and {load[1]:.2f} after" if load else ""
    lines = [f"--standalone --nproc-per-node={nproc} {worker}, median of {repetitions} runs each{loads}",
             f"{'metric':<34} {'elasticrun':>11} {'--prewarm':>11} {'torchrun':>11} {'ours/theirs':>12} "
             f"{'prewarm/theirs':>15}"]
    for label, field, form in rows:
        ours, warm, theirs = (median_of(results[name], field) for name in ("elasticrun", "prewarm", "torchrun"))
        ratios = [f"{value / theirs:.2f}x" if theirs else "n/a" for value in (ours, warm)]
        lines.append(f"{label:<34} {form.format(ours):>11} {form.format(warm):>11} {form.format(theirs):>11} "
                     f"{ratios[0]:>12} {ratios[1]:>15}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repetitions", type=int, default=5, help="runs per launcher (default 5)")
    parser.add_argument("--nproc", type=int, default=2, help="workers per run (default 2)")
    parser.add_argument("--import-torch", action="store_true", help="workers import torch and note when done")
    parser.add_argument("--json", help="also write every sample to this file")
    args = parser.parse_args(argv)
    if args.repetitions < 1 or args.nproc < 1:
        parser.error("--repetitions and --nproc must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results: dict[str, list[Sample]] = {name: [] for name in LAUNCHERS}
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as workdir:
        for name in LAUNCHERS:  # untimed: writes the bytecode cache, warms the page cache
            launch_once(name, args.nproc, workdir, args.import_torch)
        load_before = os.getloadavg()[0]
        for repetition in range(args.repetitions):
            names = list(LAUNCHERS)
            order = names[repetition % len(names):] + names[:repetition % len(names)]
            for name in order:
                sample = launch_once(name, args.nproc, workdir, args.import_torch)
                results[name].append(sample)
                print(f"  run {repetition + 1} {name:<10} first worker {sample.first_worker_s:.3f}s  "
                      f"ready {sample.workers_ready_s:.3f}s  completion {sample.completion_s:.3f}s  "
                      f"cpu {sample.cpu_s:.3f}s  "
                      f"agent RSS {sample.agent_peak_rss_mib:.1f} MiB  templates {sample.templates_rss_mib:.1f} MiB",
                      file=sys.stderr)
        load = (load_before, os.getloadavg()[0])
    sys.stderr.flush()
    print(report(results, args.nproc, args.repetitions, args.import_torch, load))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({name: [asdict(s) for s in samples] for name, samples in results.items()}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
