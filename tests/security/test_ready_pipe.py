"""Issue 34, item 5: what a live worker writes on its ready pipe (``ELASTIC_READY_FD``) cannot
kill the agent nor grow its memory. A real ``elasticrun --standalone --live-recovery`` run with
two workers (no torch): rank 0 writes 50,000 ``[`` on one line (the agent died of a
``RecursionError`` on main, and its watchdog SIGKILLed both healthy workers), then 8 MiB
without a newline; both finish, and so does the agent, with one warning.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hostile import REPO

WORKER = """
import os, time
fd = int(os.environ["ELASTIC_READY_FD"])
if os.environ["RANK"] == "0":
    os.write(fd, b"[" * 50_000 + b"\\n")
    block = b"x" * (1 << 20)
    for _ in range(8):
        os.write(fd, block)
    os.write(fd, b"\\n")
time.sleep(1.5)
open(os.path.join({out!r}, "done" + os.environ["RANK"]), "w").close()
"""


@pytest.mark.slow
def test_a_worker_writing_garbage_on_its_ready_pipe_leaves_the_agent_and_its_peer_running(tmp_path):
    script = tmp_path / "garbage.py"
    script.write_text(WORKER.format(out=str(tmp_path)))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "elastic.run", "--standalone", "--live-recovery", "--no-prewarm", "--nproc-per-node=2",
         f"--log-dir={tmp_path / 'logs'}", str(script)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "done0").exists() and (tmp_path / "done1").exists()
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    assert proc.stderr.count("skipped a line on the ready pipe that is not an answer") == 1, proc.stderr[-4000:]
