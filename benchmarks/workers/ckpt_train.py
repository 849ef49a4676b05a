"""A plain DDP worker that resumes from its checkpoint: the side-by-side benchmark's model for
the launchers that restart the whole group (stock torchrun, ``elasticrun`` without
``--live-recovery``). Writes JSON events to $LIVE_LOG as ``live_train.py`` does.

Settings (environment): LIVE_STEPS, LIVE_STEP_SLEEP (seconds of "compute" per step),
CKPT_PATH (rank 0 writes the model and optimizer there every CKPT_EVERY steps, atomically;
every rank resumes from it), CKPT_EVERY (10), LIVE_BIG_MB (0: the small model with SGD; N: the
model and Adam of ``live_train.py``'s LIVE_BIG_MB, ~N MiB of state).

Events beside the steps: ``saved`` (rank 0's save: ``save_s`` from torch.save to the rename,
the file's ``bytes``), ``loaded`` (a resume: ``load_s`` of torch.load and load_state_dict) and,
with LIVE_BIG_MB, ``state`` (the state's tensor bytes, after the first step).
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
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "worker", "workers"))
from live_model import LR, big_hidden, make_model, shard, state_nbytes  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from late_start import read_log, restart_sleep  # noqa: E402

steps = int(os.environ.get("LIVE_STEPS", "40"))
step_sleep = float(os.environ.get("LIVE_STEP_SLEEP", "0.05"))
path = os.environ["CKPT_PATH"]
every = int(os.environ.get("CKPT_EVERY", "10"))
big_mb = int(os.environ.get("LIVE_BIG_MB", "0"))
log_file = open(os.environ["LIVE_LOG"], "a", buffering=1)


def emit(**event):
    log_file.write(json.dumps(event) + "\n")


late_sleep = restart_sleep(read_log(os.environ["LIVE_LOG"]), os.environ)  # before our own start event
emit(ev="start", t=STARTED, pid=os.getpid())
time.sleep(late_sleep)
dist.init_process_group("gloo", timeout=timedelta(seconds=10))
rank, world = dist.get_rank(), dist.get_world_size()
model = make_model(0, hidden=big_hidden(big_mb))
opt = torch.optim.Adam(model.parameters(), lr=1e-3) if big_mb else torch.optim.SGD(model.parameters(), lr=LR)
first = 0
if os.path.exists(path):
    began = time.monotonic()
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    first = int(state["step"])
    emit(ev="loaded", load_s=time.monotonic() - began, step=first, t=time.monotonic())
emit(ev="resumed", step=first, t=time.monotonic(), rank=rank, world=world)
ddp = DistributedDataParallel(model)
for step in range(first, steps):
    x, y = shard(step, rank, world)
    time.sleep(step_sleep)
    opt.zero_grad()
    F.mse_loss(ddp(x), y).backward()
    opt.step()
    emit(ev="step", step=step, t=time.monotonic(), rank=rank, world=world)
    if big_mb and step == first:
        emit(ev="state", nbytes=state_nbytes({"model": model.state_dict(), "opt": opt.state_dict()}), t=time.monotonic())
    if rank == 0 and (step + 1) % every == 0:
        began = time.monotonic()
        partial = f"{path}.{os.getpid()}"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}, partial)
        os.replace(partial, path)
        emit(ev="saved", save_s=time.monotonic() - began, bytes=os.path.getsize(path), step=step + 1, t=time.monotonic())
dist.destroy_process_group()
emit(ev="done", t=time.monotonic())
