"""The side-by-side benchmark's model under TorchFT (its Manager, its DDP, a lighthouse): one
replica group of one worker. Writes JSON events to $LIVE_LOG as ``live_train.py`` does.

Settings (environment): LIVE_STEPS, LIVE_STEP_SLEEP, REPLICA_GROUP_ID, TORCHFT_LIGHTHOUSE and
the MASTER_ADDR/MASTER_PORT of the replica group's store (torchrun sets them), LIVE_BIG_MB (0:
the small model with SGD; N: the model and Adam of ``live_train.py``'s LIVE_BIG_MB),
LIVE_RESTART_SLEEP (0: seconds a worker that is not its replica group's first sleeps before its
Manager starts; ``late_start.py``). A replica
that (re)starts heals from a live one; a step counts when the Manager commits it.

Events beside the steps: ``heal`` when the Manager applies a state fetched from a peer
(``fetch_s``: its checkpoint transport's ``recv_checkpoint``, timed by wrapping it; ``load_s``:
our ``load_state_dict``) and, with LIVE_BIG_MB, ``state`` (the state's tensor bytes, after the
first committed step).

One change to TorchFT 0.2.0: its DDP communication hook asserts when the all-reduce fails (a
peer died: the work's wait raised, so its future chain was never set up), which kills the
survivor too. :class:`DDP` returns the bucket unreduced instead; the Manager has recorded the
error, so the step is not committed and the next quorum leaves the dead peer out. For the
buckets after that one in the same step, its all-reduce is a no-op whose future has no
``_fut``, which its hook does not expect either: :class:`DDP` returns that future as it is.
"""

import time

STARTED = time.monotonic()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torchft import DistributedDataParallel, Manager, ProcessGroupGloo  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "worker", "workers"))
from live_model import LR, big_hidden, make_model, shard, state_nbytes  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from late_start import read_log, restart_sleep  # noqa: E402
from torchft_timing import fetches, timed_fetches  # noqa: E402

steps = int(os.environ.get("LIVE_STEPS", "40"))
step_sleep = float(os.environ.get("LIVE_STEP_SLEEP", "0.05"))
replica = int(os.environ.get("REPLICA_GROUP_ID", "0"))
big_mb = int(os.environ.get("LIVE_BIG_MB", "0"))
log_file = open(os.environ["LIVE_LOG"], "a", buffering=1)


def emit(**event):
    log_file.write(json.dumps(event) + "\n")


class DDP(DistributedDataParallel):
    @staticmethod
    def _comm_hook(state, bucket):
        work = state.allreduce(bucket.buffer())
        work.wait()
        future = work.get_future()
        # After an error the Manager's all-reduce is a no-op whose future is plain (no _fut): the
        # second bucket of a model with several (LIVE_BIG_MB) gets that one.
        future = getattr(future, "_fut", future)
        if future is None:  # the all-reduce failed; the Manager skips this step
            future = torch.futures.Future()
            future.set_result(bucket.buffer())
        return future


late_sleep = restart_sleep(read_log(os.environ["LIVE_LOG"]), os.environ)  # before our own start event
emit(ev="start", t=STARTED, pid=os.getpid())
time.sleep(late_sleep)
model = make_model(0, hidden=big_hidden(big_mb))
opt = torch.optim.Adam(model.parameters(), lr=1e-3) if big_mb else torch.optim.SGD(model.parameters(), lr=LR)


def state_dict():
    return {"model": model.state_dict(), "opt": opt.state_dict()}


def load_state_dict(state):
    began = time.monotonic()
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    done = time.monotonic()
    emit(ev="heal", fetch_s=fetches[-1] if fetches else None, load_s=done - began, nbytes=state_nbytes(state), t=done)


manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=10)), min_replica_size=1, load_state_dict=load_state_dict,
                  state_dict=state_dict, replica_id=f"bench_{replica}", timeout=timedelta(seconds=10),
                  quorum_timeout=timedelta(seconds=60))
timed_fetches(manager._checkpoint_transport)
ddp = DDP(manager, model)
state_logged = False
while manager.current_step() < steps:
    manager.start_quorum()
    opt.zero_grad()
    rank, world = manager.participating_rank(), manager.num_participants()
    x, y = shard(manager.current_step(), rank or 0, max(world, 1))
    time.sleep(step_sleep)
    F.mse_loss(ddp(x), y).backward()
    if manager.should_commit():
        opt.step()
        emit(ev="step", step=manager.current_step() - 1, t=time.monotonic(), rank=rank, world=world)
        if big_mb and not state_logged:
            emit(ev="state", nbytes=state_nbytes(state_dict()), t=time.monotonic())
            state_logged = True
manager.shutdown(wait=False)
emit(ev="done", t=time.monotonic())
