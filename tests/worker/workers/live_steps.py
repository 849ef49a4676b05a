"""A LiveTraining worker written as docs/live-recovery.md shows: ``live.run`` over an
ElasticLoader (1 worker process, random augmentation), a model with dropout, an LR scheduler
stepped in the ``for`` body, gradient accumulation, clipping and a GradScaler, all registered.
Writes JSON events to $LIVE_LOG:

* ``attempt`` at the start of every attempt of a step: a digest of the whole state
  (``live.state_dict()`` through the codec: parameters, optimizer, scheduler, scaler, step,
  seed, data position), a random draw, the scheduler's ``last_epoch``, and the micro-batches'
  dataset indices with a digest of each sample's data;
* ``step`` in the ``for`` body of every committed step, with how many bodies this process ran.

Settings (environment): LIVE_STEPS, LIVE_OPTIONS (JSON kwargs of LiveOptions), DATA_SAMPLES;
CRASH_AT ``step:S`` (SIGKILL itself in the first attempt of step S, before its collectives) or
``body:S`` (in the ``for`` body of step S, after the commit, before the scheduler's step);
HOLD_AT and HOLD_FILE (wait in the ``for`` body of step HOLD_AT while HOLD_FILE exists; comma
lists of steps and files for several holds).
"""

import contextlib
import hashlib
import json
import os
import signal
import time

import torch
import torch.nn.functional as F
import torch.utils.data as tud

from elastic.worker import ElasticLoader, LiveOptions, LiveTraining
from elastic.worker.codec import encode_state

steps = int(os.environ["LIVE_STEPS"])
options = LiveOptions(**json.loads(os.environ.get("LIVE_OPTIONS", "{}")))
crash_where, _, crash_step = os.environ.get("CRASH_AT", ":-1").partition(":")
holds = dict(zip(map(int, os.environ.get("HOLD_AT", "-1").split(",")), os.environ.get("HOLD_FILE", "").split(",")))
log_file = open(os.environ["LIVE_LOG"], "a", buffering=1)


def emit(**event):
    log_file.write(json.dumps(event) + "\n")


class Augmented(tud.Dataset):
    """Sample ``i``: its index, a point near ``i`` with random noise (the augmentation), a target."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        base = torch.linspace(-1, 1, 4) * index / self.length
        x = base + 0.05 * torch.randn(4)
        return torch.tensor(index), x, base.sum(dim=0, keepdim=True)


def digest(value) -> str:
    encoded = encode_state(value, 1 << 20)
    parts = [encoded.header] + [chunk.numpy().tobytes() for chunk in encoded.chunks]
    return hashlib.sha256(b"".join(parts)).hexdigest()[:16]


def crash(where: str, step: int) -> None:
    if crash_where == where and int(crash_step) == step:
        log_file.flush()
        os.kill(os.getpid(), signal.SIGKILL)


emit(ev="start", t=time.monotonic(), pid=os.getpid(), slot=os.environ.get("LIVE_SLOT"))
torch.manual_seed(int(os.environ.get("RANK", "0")))  # different per rank: the first heal equalises
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.2), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
scaler = torch.amp.GradScaler("cpu", growth_interval=3)
loader = ElasticLoader(Augmented(int(os.environ["DATA_SAMPLES"])), batch_size=2, accumulation=2, num_workers=1,
                       seed=3, multiprocessing_context="fork")
live = LiveTraining(state={"model": model, "opt": opt, "sched": sched, "scaler": scaler}, options=options)


def train_step(step):
    emit(ev="attempt", step=step.step, attempt=step.attempt, rank=step.rank, world=step.world_size,
         round=live.round.round, state=digest(live.state_dict()), draw=torch.rand(()).item(),
         last_epoch=sched.last_epoch, position=loader.state_dict(), batches=[micro.data[0].tolist() for micro in step.batches],
         samples=[[index, digest(x)] for micro in step.batches for index, x in zip(micro.data[0].tolist(), micro.data[1])],
         t=time.monotonic())
    crash("step", step.step)
    opt.zero_grad(set_to_none=True)
    for i, micro in enumerate(step.batches):
        _, x, y = micro.data
        with ddp.no_sync() if i < len(step.batches) - 1 else contextlib.nullcontext():
            loss = F.mse_loss(ddp(x), y) * micro.weight
            scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    return loss.item()


bodies = 0
with live, loader:
    ddp = live.ddp(model)
    for done in live.run(train_step, data=loader, until=steps):
        bodies += 1
        crash("body", done.step)
        sched.step()
        emit(ev="step", step=done.step, rank=done.rank, world=done.world_size, round=live.round.round,
             attempts=done.attempts, samples=done.samples, bodies=bodies, lr=sched.get_last_lr()[0],
             t=time.monotonic())
        deadline = time.monotonic() + 120
        while done.step in holds and os.path.exists(holds[done.step]) and time.monotonic() < deadline:
            time.sleep(0.02)
emit(ev="done", step=live.step, t=time.monotonic())
