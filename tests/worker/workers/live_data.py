"""A LiveTraining worker that takes its data from an ElasticLoader with 2 worker processes, as
docs/live-recovery.md ("Data that follows the world") shows; writes JSON events to $LIVE_LOG.

Every committed step logs the dataset indices it trained on (fillers left out), its epoch and
position, its round, rank and world. Settings (environment): LIVE_STEPS, LIVE_STEP_SLEEP,
LIVE_OPTIONS (JSON kwargs of LiveOptions), DATA_SAMPLES (the dataset's length).
"""

import json
import os
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F
import torch.utils.data as tud

from elastic.worker import LiveOptions, LiveTraining
from elastic.worker.data import ElasticLoader

steps = int(os.environ["LIVE_STEPS"])
step_sleep = float(os.environ.get("LIVE_STEP_SLEEP", "0.02"))
options = LiveOptions(**json.loads(os.environ.get("LIVE_OPTIONS", "{}")))
log_file = open(os.environ["LIVE_LOG"], "a", buffering=1)


def emit(**event):
    log_file.write(json.dumps(event) + "\n")


class Indexed(tud.Dataset):
    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        x = torch.tensor([index / self.length])
        return torch.tensor(index), x, 2 * x


emit(ev="start", t=time.monotonic(), pid=os.getpid(), slot=os.environ.get("LIVE_SLOT"))
torch.manual_seed(0)
model = torch.nn.Linear(1, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = ElasticLoader(Indexed(int(os.environ["DATA_SAMPLES"])), batch_size=2, accumulation=2, num_workers=2,
                       seed=3, multiprocessing_context="fork")


def state_dict():
    return {"model": model.state_dict(), "opt": opt.state_dict(), "data": loader.state_dict()}


def load_state_dict(state):
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    loader.load_state_dict(state["data"])


with LiveTraining(state_dict, load_state_dict, options=options) as live, loader:
    ddp = live.ddp(model)
    while live.step < steps:
        step = live.step
        with live.train_step():
            loader.set_world(live.rank, live.world_size)
            batches = loader.next_step()
            time.sleep(step_sleep)
            opt.zero_grad()
            for i, micro in enumerate(batches):
                index, x, y = micro.data
                with ddp.no_sync() if i < len(batches) - 1 else nullcontext():
                    (F.mse_loss(ddp(x), y) * micro.weight).backward()
            opt.step()
        if live.step > step:  # committed: only now does the data move on
            loader.commit()
            used = [i for micro in batches if micro.samples for i in micro.data[0].tolist()]
            plan = batches.plan
            emit(ev="step", step=step, round=live.round.round, rank=live.rank, world=live.world_size,
                 epoch=plan.position.epoch, consumed=plan.position.consumed, used=used, t=time.monotonic())
emit(ev="done", step=live.step, t=time.monotonic())
