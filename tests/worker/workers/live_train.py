"""A live-recovery worker for the tests and the benchmark; writes JSON events to $LIVE_LOG.

Settings (environment): LIVE_STEPS (40), LIVE_STEP_SLEEP (0.05 s of "compute" per step),
LIVE_OPTIONS (JSON kwargs of LiveOptions), LIVE_CHECK (1: all-reduce a parameter checksum at
the start of every step and log whether every rank had the same), LIVE_BIG_MB (0: the small
model with SGD; N: a hidden layer of N/3 MiB of parameters, and Adam, for a state of ~N MiB;
a ``state`` event gives its bytes after the first step, and steps log no parameter sum),
LIVE_START_SLEEP (0: seconds to sleep before LiveTraining starts, as a replacement that takes
that long to be ready: a GPU's initialisation, a model's construction), LIVE_LATE_START_SLEEP (0:
the same, only for a worker started after the job's first round: a replacement, a joining node's).
"""

import time

STARTED = time.monotonic()

import dataclasses  # noqa: E402
import enum  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from live_model import LR, big_hidden, full_loss, make_model, shard, state_nbytes  # noqa: E402

from elastic.worker import LiveOptions, LiveTraining, RecoveryFailed  # noqa: E402

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
steps = int(os.environ.get("LIVE_STEPS", "40"))
step_sleep = float(os.environ.get("LIVE_STEP_SLEEP", "0.05"))
check = os.environ.get("LIVE_CHECK", "1") == "1"
big_mb = int(os.environ.get("LIVE_BIG_MB", "0"))
options = LiveOptions(**json.loads(os.environ.get("LIVE_OPTIONS", "{}")))
log_file = open(os.environ["LIVE_LOG"], "a", buffering=1)


def emit(**event):
    log_file.write(json.dumps(event) + "\n")


def plain(value):
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    return value


emit(ev="start", t=STARTED, pid=os.getpid(), slot=os.environ.get("LIVE_SLOT"))
late = os.environ.get("ELASTIC_ROUND", "0") not in ("", "0") or os.environ.get("ELASTIC_REFILL") == "1"
time.sleep(float(os.environ.get("LIVE_START_SLEEP", "0")) + (float(os.environ.get("LIVE_LATE_START_SLEEP", "0")) if late else 0.0))
# Different per rank: the first heal equalises. With LIVE_BIG_MB the hidden layer is wide enough
# that parameters + Adam's two moments come to about that many MiB (18 parameters per unit).
model = make_model(int(os.environ.get("RANK", "0")), hidden=big_hidden(big_mb))
opt = torch.optim.Adam(model.parameters(), lr=1e-3) if big_mb else torch.optim.SGD(model.parameters(), lr=LR)


def state_dict():
    return {"model": model.state_dict(), "opt": opt.state_dict()}


def load_state_dict(state):
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])


def checksum() -> torch.Tensor:
    flat = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
    return torch.stack([flat.sum(), (flat * flat).sum()])


def count(path):
    try:
        return len(os.listdir(path))
    except OSError:
        return -1


live = LiveTraining(state_dict, load_state_dict, options=options)
try:
    live.start()
    ddp = live.ddp(model)
    seen = 0
    seen_state = False
    while live.step < steps:
        with live.train_step():
            step = live.step
            equal = None
            if check:
                mine = checksum()
                high = live.all_reduce(mine.clone(), dist.ReduceOp.MAX)
                low = -live.all_reduce(-mine, dist.ReduceOp.MAX)
                equal = bool(torch.equal(high, low))
            loss = full_loss(model, step) if not big_mb else None
            x, y = shard(step, live.rank, live.world_size)
            time.sleep(step_sleep)
            opt.zero_grad()
            F.mse_loss(ddp(x), y).backward()
            opt.step()
        if live.step == step + 1:  # committed
            if big_mb and not seen_state:  # once per process: the state's size, as the other workers log it
                emit(ev="state", nbytes=state_nbytes(state_dict()), t=time.monotonic())
                seen_state = True
            total = float(checksum()[0]) if not big_mb else None  # the big model: no per-step extra, as the others
            emit(ev="step", step=step, t=time.monotonic(), round=live.round.round, rank=live.rank, world=live.world_size,
                 loss=loss, sum=total, equal=equal, threads=count("/proc/self/task"), fds=count("/proc/self/fd"),
                 hung=live.abandoned_works)
        for recovery in list(live.recoveries)[seen:]:
            emit(ev="recovery", **{key: plain(value) for key, value in dataclasses.asdict(recovery).items()})
        seen = len(live.recoveries)
except RecoveryFailed as error:
    emit(ev="failed", error=str(error), type=type(error).__name__, t=time.monotonic())
    raise
emit(ev="done", step=live.step, t=time.monotonic())
live.close()
emit(ev="closed", t=time.monotonic())
