"""Start cost of one worker: forked from a ``--prewarm`` template against a fresh interpreter.

Run:  python benchmarks/fork_start.py [--repetitions 10] [--modules torch]

A one-rank :class:`~elastic.agent.prewarm.pool.TemplatePool` imports ``--modules``; each repetition
forks a worker whose script notes the wall time it started and the time ``import torch``
returned (instant in a fork), and measures both from the moment the agent sent the request.
The same script is then started as ``python -u script`` the normal way. Prints the template's
time to ready and the medians; then memory (RSS, PSS, USS from ``/proc/<pid>/smaps``) of the
template alone, of the template and a forked worker that imported torch and computed, and of
the same worker started normally.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from elastic.agent.prewarm.control import TemplateState  # noqa: E402
from elastic.agent.prewarm.pool import TemplatePool  # noqa: E402
from elastic.config import Entrypoint, LaunchConfig  # noqa: E402

SCRIPT = "import time\nstarted = time.time()\nimport torch\nprint(started, time.time(), flush=True)\n"
RESIDENT = "import sys, time, torch\nx = torch.ones(1000) * 2\nprint('up', flush=True)\ntime.sleep(60)\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repetitions", type=int, default=10)
    parser.add_argument("--modules", default="torch")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-fork-") as workdir:
        script = os.path.join(workdir, "worker.py")
        with open(script, "w") as out:
            out.write(SCRIPT)
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, entrypoint=Entrypoint("script", script),
                              prewarm=True, prewarm_modules=tuple(args.modules.split(",")))
        pool = TemplatePool(config, dict(os.environ), sys.executable, cwd=workdir)
        began = time.monotonic()
        pool.start()
        try:
            template = pool.templates()[0]
            if template.wait_ready(120) is not TemplateState.READY:
                print(f"the template is {template.state.value}: {template.reason}", file=sys.stderr)
                return 1
            ready_s = time.monotonic() - began
            forked = [_forked(pool, script) for _ in range(args.repetitions)]
            memory = _memory(pool, template.pid, workdir)
        finally:
            pool.close()
        fresh = [_fresh(script) for _ in range(args.repetitions)]
    print(f"template ready after {ready_s:.2f}s (imports {args.modules})")
    print(f"{'median of ' + str(args.repetitions):<28} {'script started':>15} {'torch imported':>15}")
    for label, samples in (("forked from the template", forked), ("python -u script", fresh)):
        print(f"{label:<28} {statistics.median(s[0] for s in samples):>14.4f}s "
              f"{statistics.median(s[1] for s in samples):>14.4f}s")
    print(f"{'memory, MiB':<40} {'RSS':>6} {'PSS':>6} {'USS':>6}")
    for label, (rss, pss, uss) in memory.items():
        print(f"{label:<40} {rss:>6.0f} {pss:>6.0f} {uss:>6.0f}")
    return 0


def _usage(pid: int) -> tuple[float, float, float]:
    info = psutil.Process(pid).memory_full_info()
    return info.rss / 2**20, info.pss / 2**20, info.uss / 2**20


def _memory(pool: TemplatePool, template_pid: int, workdir: str) -> dict[str, tuple[float, float, float]]:
    """RSS/PSS/USS of the template alone, with a forked worker, and of a normal worker."""
    script = os.path.join(workdir, "resident.py")
    with open(script, "w") as out:
        out.write(RESIDENT)
    found = {"template alone": _usage(template_pid)}
    read_end, write_end = os.pipe()
    job = dataclasses.replace(pool.job(dict(os.environ), []), target=script)
    worker = pool.fork(0, job, {"stdout": write_end, "stderr": 2}, [script])
    os.close(write_end)
    if worker is None:
        raise RuntimeError("the template did not fork")
    try:
        os.read(read_end, 16)
        time.sleep(0.5)
        found["template, while its worker runs"] = _usage(template_pid)
        found["forked worker (torch imported, used)"] = _usage(worker.pid)
    finally:
        worker.kill()
        worker.wait(10)
        os.close(read_end)
    normal = subprocess.Popen([sys.executable, "-u", script], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    try:
        normal.stdout.readline()
        time.sleep(0.5)
        found["the same worker started normally"] = _usage(normal.pid)
    finally:
        normal.kill()
        normal.wait()
        normal.stdout.close()
    return found


def _forked(pool: TemplatePool, script: str) -> tuple[float, float]:
    read_end, write_end = os.pipe()
    sent = time.time()
    worker = pool.fork(0, pool.job(dict(os.environ), []), {"stdout": write_end, "stderr": 2}, [script])
    os.close(write_end)
    if worker is None:
        raise RuntimeError("the template did not fork")
    with open(read_end, "rb") as out:
        started, imported = map(float, out.read().split())
    worker.wait(30)
    return started - sent, imported - sent


def _fresh(script: str) -> tuple[float, float]:
    sent = time.time()
    out = subprocess.run([sys.executable, "-u", script], check=True, capture_output=True).stdout
    started, imported = map(float, out.split())
    return started - sent, imported - sent


if __name__ == "__main__":
    sys.exit(main())
