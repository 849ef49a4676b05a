"""What a live worker writing garbage on its ready pipe costs its agent.

Run:  python benchmarks/ready_pipe_hostile.py [--seconds 20] [--code DIR]

Runs ``elasticrun --standalone --live-recovery --no-prewarm --nproc-per-node=2`` (from
``--code``: a checkout, default this one, so an older commit can be measured the same way)
three times, rank 0 writing on ``ELASTIC_READY_FD``: nothing (the baseline); one line of 50,000
``[``; 1 MiB blocks without a newline for ``--seconds``. Prints the agent's exit code and its
RSS 0.5 s after start and at its peak (sampled every 20 ms).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parents[1]
WORKER = """
import os, sys, time
fd = int(os.environ["ELASTIC_READY_FD"])
if os.environ["RANK"] == "0" and sys.argv[2] == "1":
    os.write(fd, b"[" * 50_000 + b"\\n")
if os.environ["RANK"] == "0":
    block, written = b"x" * (1 << 20), 0
    end = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < end:
        written += os.write(fd, block)
    print(f"flooded {written >> 20} MiB", flush=True)
time.sleep(1)
"""


def measure(code: Path, seconds: float, nested: bool, workdir: Path) -> str:
    script = workdir / "flood.py"
    script.write_text(WORKER)
    agent = subprocess.Popen(
        [sys.executable, "-c", "import sys; del sys.path[0]; from elastic.run import main; sys.exit(main())",
         "--standalone", "--live-recovery", "--no-prewarm", "--nproc-per-node=2", str(script), str(seconds),
         str(int(nested))],
        env={**os.environ, "PYTHONPATH": str(code)}, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    try:
        process = psutil.Process(agent.pid)
        time.sleep(0.5)
        start = peak = process.memory_info().rss
        while agent.poll() is None:
            try:
                peak = max(peak, process.memory_info().rss)
            except psutil.Error:
                break
            time.sleep(0.02)
        out = agent.communicate(timeout=300)[0]
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    flooded = next((line for line in out.splitlines() if line.startswith("flooded")), "flooded nothing")
    what = "nested line" if nested else f"flood {seconds:g} s" if seconds else "baseline"
    return (f"{what:12}: rc {agent.returncode}, agent RSS {start >> 20} MiB at 0.5 s, peak {peak >> 20} MiB "
            f"(+{(peak - start) >> 20} MiB); rank 0 {flooded}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--code", type=Path, default=HERE)
    args = parser.parse_args()
    print(f"code: {args.code}; load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as workdir:
        for seconds, nested in ((0.0, False), (0.0, True), (args.seconds, False)):
            print(measure(args.code, seconds, nested, Path(workdir)))


if __name__ == "__main__":
    main()
