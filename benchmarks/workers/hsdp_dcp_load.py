"""One HSDP replica's sharded checkpoint, saved once and loaded into a fresh FSDP2 model and
optimizer: the reload ``benchmarks/hsdp_heal.py`` sets beside a live shard heal. Run by
``torchrun --standalone --nproc-per-node 2`` (gloo, CPU); each rank writes one JSON object to
``RESULT_DIR/rank<r>.json`` (torchrun's forwarded stdout can join two ranks' lines).

Settings (environment): HSDP_HIDDEN (the model's hidden width), CKPT_DIR (where to save),
RESULT_DIR.

Per rank: ``save_s`` (``dcp.save``), ``load_s`` (from a barrier: ``get_state_dict`` of the fresh
model and optimizer, ``dcp.load`` from local disk, ``set_state_dict``; the slowest rank's is the
replica's reload), ``bytes`` (this rank's state: its parameter shards and AdamW moments),
``disk_bytes`` (the checkpoint's files), ``same`` (the loaded shards equal the saved ones).
"""

import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hsdp_model import batch, local_nbytes, make_sharded  # noqa: E402

from elastic.worker.hsdp import shard_checksum  # noqa: E402

hidden, directory = int(os.environ["HSDP_HIDDEN"]), os.environ["CKPT_DIR"]
dist.init_process_group("gloo", timeout=timedelta(seconds=120))
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))


def trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = make_sharded(mesh, hidden)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    F.mse_loss(model(batch(0, rank)[0]), batch(0, rank)[1]).backward()
    opt.step()
    return model, opt


model, opt = trained()
saved_sum = shard_checksum(model)
dist.barrier()
began = time.monotonic()
model_state, opt_state = get_state_dict(model, opt)
dcp.save({"model": model_state, "opt": opt_state}, checkpoint_id=directory)
save_s = time.monotonic() - began
del model, opt, model_state, opt_state

model = make_sharded(mesh, hidden)  # fresh: the seed's parameters, no optimizer state yet
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
dist.barrier()
began = time.monotonic()
model_state, opt_state = get_state_dict(model, opt)
state = {"model": model_state, "opt": opt_state}
dcp.load(state, checkpoint_id=directory)
set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["opt"])
load_s = time.monotonic() - began
disk = sum(os.path.getsize(os.path.join(directory, name)) for name in os.listdir(directory))
result = {"rank": rank, "save_s": save_s, "load_s": load_s, "bytes": local_nbytes(model, opt), "disk_bytes": disk,
          "same": shard_checksum(model) == saved_sum}
partial = os.path.join(os.environ["RESULT_DIR"], f"rank{rank}.json.partial")
with open(partial, "w") as file:
    json.dump(result, file)
os.replace(partial, partial[:-len(".partial")])
dist.destroy_process_group()
