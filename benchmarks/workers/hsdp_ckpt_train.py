"""HSDP with a sharded checkpoint, for stock torchrun: the side-by-side benchmark's HSDP model
(``hsdp_model.py``) over a 2-D mesh (replicate across nodes, shard inside a node), saved with
``torch.distributed.checkpoint`` every CKPT_EVERY steps and resumed from the newest save.
Writes JSON events to $LIVE_LOG as ``ckpt_train.py`` does.

Settings (environment): LIVE_STEPS, LIVE_STEP_SLEEP (seconds of "compute" per step), CKPT_DIR
(each save goes to ``step-<n>/`` there; ``latest`` names the newest complete one), CKPT_EVERY
(10), LOCAL_WORLD_SIZE (the shard dimension; torchrun sets it), LIVE_RESTART_SLEEP
(``late_start.py``).

Every rank logs ``start``; local rank 0 logs the steps (``world``: the ranks), ``saved``
(``save_s`` of ``dcp.save``, the checkpoint's ``bytes`` on disk) and, on every rank, a resume's
``loaded`` (``load_s`` of ``dcp.load`` and ``set_state_dict``, ``bytes``: this rank's state).
"""

import time

STARTED = time.monotonic()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hsdp_model import batch, local_nbytes, make_sharded  # noqa: E402
from late_start import read_log, restart_sleep  # noqa: E402

steps = int(os.environ.get("LIVE_STEPS", "40"))
step_sleep = float(os.environ.get("LIVE_STEP_SLEEP", "0.05"))
directory = os.environ["CKPT_DIR"]
every = int(os.environ.get("CKPT_EVERY", "10"))
local_rank, shards = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
log_file = open(os.environ["LIVE_LOG"], "a", buffering=1)


def emit(**event):
    log_file.write(json.dumps(event) + "\n")


late_sleep = restart_sleep(read_log(os.environ["LIVE_LOG"]), os.environ)
emit(ev="start", t=STARTED, pid=os.getpid(), local_rank=local_rank)
time.sleep(late_sleep)
dist.init_process_group("gloo", timeout=timedelta(seconds=10))
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world // shards, shards), mesh_dim_names=("replicate", "shard"))
model = make_sharded(mesh)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
latest = os.path.join(directory, "latest")
first = 0
if os.path.exists(latest):
    with open(latest) as file:
        first = int(file.read())
    began = time.monotonic()
    model_state, opt_state = get_state_dict(model, opt)
    state = {"model": model_state, "opt": opt_state}
    dcp.load(state, checkpoint_id=os.path.join(directory, f"step-{first}"))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["opt"])
    emit(ev="loaded", load_s=time.monotonic() - began, bytes=local_nbytes(model, opt), step=first, rank=rank,
         t=time.monotonic())
emit(ev="resumed", step=first, t=time.monotonic(), rank=rank, world=world)
for step in range(first, steps):
    opt.zero_grad(set_to_none=True)
    x, y = batch(step, rank)
    F.mse_loss(model(x), y).backward()  # FSDP2: reduce-scatter in the node, all-reduce across
    time.sleep(step_sleep)
    opt.step()
    if local_rank == 0:
        emit(ev="step", step=step, t=time.monotonic(), rank=rank, world=world)
    if (step + 1) % every == 0:
        began = time.monotonic()
        target = os.path.join(directory, f"step-{step + 1}")
        model_state, opt_state = get_state_dict(model, opt)
        dcp.save({"model": model_state, "opt": opt_state}, checkpoint_id=target)  # collective: done on all
        if rank == 0:
            partial = f"{latest}.{os.getpid()}"
            with open(partial, "w") as file:
                file.write(str(step + 1))
            os.replace(partial, latest)
            size = sum(os.path.getsize(os.path.join(target, name)) for name in os.listdir(target))
            emit(ev="saved", save_s=time.monotonic() - began, bytes=size, step=step + 1, t=time.monotonic())
dist.destroy_process_group()
emit(ev="done", t=time.monotonic())
