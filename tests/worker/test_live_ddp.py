"""``live.ddp(model)`` (:func:`elastic.worker.ddp.live_ddp`) in a real worker process.

It forces ``find_unused_parameters=True``, and torch then advised, on stderr at the first
forward of every worker, to turn that flag off (a C++ warning Python cannot filter). The
worker here builds a live DDP on a small model whose parameters are all used, trains a few
steps with a bucket reducer that averages over one rank, and its stderr must hold only what
the script itself printed; a model that leaves a parameter unused must still train.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from elastic.testing.agents import clean_env

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.needs_torch]  # a process that imports torch

WORKER = textwrap.dedent("""
    import sys
    import torch
    from elastic.worker.ddp import live_ddp

    class OneRank:
        def bucket_allreduce(self, buffer):
            done = torch.futures.Future()
            done.set_result(buffer)
            return done

    class PartlyUsed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.used(x)

    print("before", file=sys.stderr, flush=True)
    for module in (torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)), PartlyUsed()):
        model = live_ddp(OneRank(), module)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(5, 4)).sum().backward()
            optimizer.step()
    print("after", file=sys.stderr, flush=True)
""")


def test_a_live_ddp_trains_without_torchs_find_unused_parameters_advice_on_stderr(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    result = subprocess.run([sys.executable, str(script)], env=clean_env(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"),
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.splitlines() == ["before", "after"], result.stderr[-3000:]
