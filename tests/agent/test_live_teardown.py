"""A live worker ends every gloo group it formed, threads and all, by the end of its run.

The exit race of ``examples/train_ddp.py`` (a gloo thread that drops the last collective of a
backward pass while the interpreter finalizes takes the GIL and aborts the process) needs a
group alive at exit. A live worker had two: the private one-rank gloo group of ``live.ddp()``,
held by the DDP (reference cycles) until a garbage collection, and the first round's group,
kept for the process's life by the ``group=`` defaults of ``torch.distributed.nn`` when DDP's
construction imported it after that group formed. Started without a pre-warmed template (as
torchrun would), and with the garbage collector off, no gloo thread (``pt_gloo_runloop``,
``gloo_tcp_loop``) may run once the run ended.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from elastic.testing import agents

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from live_checks import REPO  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.needs_torch]  # real agents, real gloo groups

WORKER = REPO / "tests" / "worker" / "workers" / "live_exit.py"


@pytest.mark.parametrize("nproc", [1, 2])
def test_no_gloo_thread_outlives_a_live_run(procs, nproc):
    env = agents.clean_env(TMPDIR=str(procs.workdir), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    agent = procs.elasticrun("--standalone", "--nproc-per-node", str(nproc), "--max-restarts", "0", "--live-recovery",
                             "--no-prewarm", str(WORKER), env=env)
    assert agent.wait() == 0, agent.describe(stdout_chars=3000)
    stdout = agent.stdout
    assert sorted(line for line in stdout.splitlines() if " done: " in line) == \
        [f"rank {rank} done: step 3" for rank in range(nproc)], stdout
    threads = [line for line in stdout.splitlines() if line.startswith("threads after main:")]
    assert len(threads) == nproc and not any("gloo" in line for line in threads), stdout
