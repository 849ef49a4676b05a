"""``examples/train_ddp.py`` resumes consistently without shared storage (issue 26 item 7).

Two machines simulated by two ``elasticrun`` agents on etcd, each with its own checkpoint path
(machines do not share ``/tmp``): node A holds a checkpoint at step 40, node B none (a machine
that rejoins with an empty disk). Every rank of the world must resume at step 40 with A's
parameters, not B's ranks from step 0 beside A's from step 40.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from e2e import etcd_flags

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.needs_torch]

STEPS = 60
CHECKPOINT_STEP = 40
LINE = re.compile(r"rank (\d+) of (\d+): starting at step (\d+) .*?parameters ([0-9a-f]{12})\)")  # two ranks' lines may share one


def example():
    spec = importlib.util.spec_from_file_location("train_ddp", REPO / "examples" / "train_ddp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_checkpoint(module, path) -> str:
    """A checkpoint at step 40 with parameters no fresh start has; its parameters' digest."""
    torch.manual_seed(1234)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    module.save_checkpoint(str(path), model, optimizer, CHECKPOINT_STEP)
    return module.parameters_digest(model)


@pytest.mark.etcd
def test_every_rank_resumes_at_the_newest_checkpoint_with_equal_parameters(procs, tmp_path, etcd_server):
    module = example()
    (tmp_path / "A").mkdir()
    (tmp_path / "B").mkdir()
    saved = write_checkpoint(module, tmp_path / "A" / "ckpt.pt")
    flags = etcd_flags(etcd_server)
    agents = []
    for node, nproc in (("A", 1), ("B", 2)):
        agents.append(procs.elasticrun("--nnodes=2", f"--nproc-per-node={nproc}", *flags,
                                       str(REPO / "examples" / "train_ddp.py"), "--steps", str(STEPS),
                                       "--checkpoint", str(tmp_path / node / "ckpt.pt"), name=node))
    for agent in agents:
        assert agent.wait() == 0, agent.describe()
    output = "".join(agent.stdout for agent in agents)
    starts = {int(rank): (int(world), int(step), digest) for rank, world, step, digest in LINE.findall(output)}
    assert sorted(starts) == [0, 1, 2], output
    assert set(starts.values()) == {(3, CHECKPOINT_STEP, saved)}, output
    assert f"done: {STEPS} steps" in output
    # B's machine now keeps its own copy of the job's state too.
    assert torch.load(tmp_path / "B" / "ckpt.pt")["step"] == STEPS
