"""HSDP under TorchFT 0.2.0: the side-by-side benchmark's HSDP model (``hsdp_model.py``) sharded
by FSDP2 over one replica group (``torchrun --standalone``, 2 workers), its gradient shards
averaged across replica groups by the Manager's fault-tolerant all-reduce, through FSDP2's
``set_all_reduce_hook`` (TorchFT 0.2.0 has no managed device mesh: ``ft_init_device_mesh`` is
gone; this is how its own ``fsdp_test.py`` wires FSDP2 to a replicate group). Writes JSON
events to $LIVE_LOG as ``torchft_train.py`` does.

Settings (environment): LIVE_STEPS, LIVE_STEP_SLEEP, REPLICA_GROUP_ID, TORCHFT_LIGHTHOUSE and
the replica group's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (torchrun sets them).

Each rank's Manager heals its own shard (:class:`ParamShards` and
:class:`elastic.worker.hsdp.OptimizerShardState`: the DTensors' local tensors) from the rank of a
live replica group with the same group rank. TorchFT asks for the state on its quorum thread
while the training thread runs forward and backward, so :class:`ParamShards` reads the sharded
parameters it kept a hold of, never ``module.state_dict()`` (FSDP2's state-dict hooks reshard
the module under the running backward: ``setStorage: ... out of bounds for storage of size 0``). Every rank logs ``start``; group rank 0 logs the committed steps
(``world``: ranks); every rank logs a ``heal`` (``fetch_s``, ``load_s``, ``nbytes``).
"""

import time

STARTED = time.monotonic()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torchft import Manager, ProcessGroupGloo  # noqa: E402

from elastic.worker.hsdp import OptimizerShardState  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hsdp_model import batch, make_sharded  # noqa: E402
from torchft_timing import fetches, timed_fetches  # noqa: E402

steps = int(os.environ.get("LIVE_STEPS", "40"))
step_sleep = float(os.environ.get("LIVE_STEP_SLEEP", "0.05"))
replica = int(os.environ.get("REPLICA_GROUP_ID", "0"))
log_file = open(os.environ["LIVE_LOG"], "a", buffering=1)


def emit(**event):
    log_file.write(json.dumps(event) + "\n")


emit(ev="start", t=STARTED, pid=os.getpid())
dist.init_process_group("gloo", timeout=timedelta(seconds=10))
group_rank, shards = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (shards,), mesh_dim_names=("shard",))
model = make_sharded(mesh)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)


class ParamShards:
    """The sharded parameters' local tensors, held from the start: safe to read on another thread."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.params = dict(module.named_parameters())  # the sharded DTensors, outside forward

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: param.to_local().detach() for name, param in self.params.items()}

    def load_state_dict(self, received) -> None:
        with torch.no_grad():
            for name, param in self.params.items():
                param.to_local().copy_(received[name])


state = {"model": ParamShards(model), "opt": OptimizerShardState(opt)}


def state_dict():
    return {name: part.state_dict() for name, part in state.items()}


def load_state_dict(received):
    began = time.monotonic()
    for name, part in state.items():
        part.load_state_dict(received[name])
    done = time.monotonic()
    nbytes = sum(t.numel() * t.element_size() for t in received["model"].values())
    nbytes += sum(v.numel() * v.element_size() for entry in received["opt"]["state"].values()
                  for v in entry.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    emit(ev="heal", fetch_s=fetches[-1] if fetches else None, load_s=done - began, nbytes=nbytes, t=done)


manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=10)), min_replica_size=1, load_state_dict=load_state_dict,
                  state_dict=state_dict, replica_id=f"bench_{replica}", timeout=timedelta(seconds=10),
                  quorum_timeout=timedelta(seconds=60))
timed_fetches(manager._checkpoint_transport)


def across_replicas(output: torch.Tensor) -> None:
    """FSDP2's all-reduce hook: average the reduce-scatter's output over the replica groups."""
    manager.allreduce(output).wait()  # an error is recorded by the Manager: the step is not committed


for module in model.modules():
    if hasattr(module, "set_all_reduce_hook"):
        module.set_all_reduce_hook(across_replicas)
while manager.current_step() < steps:
    manager.start_quorum()
    opt.zero_grad(set_to_none=True)
    x, y = batch(manager.current_step(), replica * shards + group_rank)
    F.mse_loss(model(x), y).backward()
    time.sleep(step_sleep)
    if manager.should_commit():
        opt.step()
        if group_rank == 0:
            emit(ev="step", step=manager.current_step() - 1, t=time.monotonic(), world=manager.num_participants() * shards)
manager.shutdown(wait=False)
emit(ev="done", t=time.monotonic())
