"""``examples/train_ddp.py`` ends its gloo group, threads and all, before its interpreter exits.

Under load, a worker of the README's quick start was at times aborted at exit (SIGABRT,
"terminate called without an active exception"): ``destroy_process_group()`` left the gloo group
running, held by DDP (through reference cycles) and by the ``group=`` defaults of
``torch.distributed.nn`` (imported by DDP's construction, after the group existed), and a gloo
thread that dropped the last collective of a backward pass while the interpreter finalized took
the GIL and died in a ``noexcept`` destructor. The race is rare; what rules it out is checked
here: once ``main()`` returns, no gloo thread runs any more (torch names them
``pt_gloo_runloop`` and ``gloo_tcp_loop``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from elastic.testing.agents import clean_env
from elastic.testing.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.needs_torch]  # a real gloo group

REPO = Path(__file__).resolve().parents[2]

# argv[1]: the example; argv[2]: its checkpoint. Prints the process's thread names after main().
# No automatic garbage collection: that the group ends must not depend on when one happens to run.
PROGRAM = r"""
import gc, os, runpy, sys
gc.disable()
example, checkpoint = sys.argv[1], sys.argv[2]
sys.argv = [example, "--steps", "4", "--checkpoint-every", "2", "--checkpoint", checkpoint]
runpy.run_path(example, run_name="train_ddp")["main"]()
tasks = sorted(os.listdir("/proc/self/task"))
print("threads after main:", " ".join(sorted(open(f"/proc/self/task/{task}/comm").read().strip() for task in tasks)))
"""


def test_no_gloo_thread_outlives_the_examples_main(tmp_path):
    env = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                    LOCAL_RANK="0", OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(REPO / "examples" / "train_ddp.py"),
                           str(tmp_path / "checkpoint.pt")], env=env, capture_output=True, text=True, timeout=180,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done: 4 steps" in done.stdout, done.stdout
    threads = [line for line in done.stdout.splitlines() if line.startswith("threads after main:")]
    assert len(threads) == 1 and "gloo" not in threads[0], done.stdout
