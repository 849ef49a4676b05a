"""The chaos suite's live-recovery worker: ``workers/train.py``'s records from a LiveTraining loop.

    live_train.py OUT_DIR --steps N --step-seconds S

Run by ``elasticrun --live-recovery``: a small DDP model (``tests/worker/workers/live_model.py``,
gloo, CPU) trains N steps of S seconds under :class:`elastic.worker.LiveTraining`, which keeps
the process through every new round and heals a worker that is behind from a live peer. No
checkpoint: the state lives in the workers.

It writes the records :mod:`chaoslib` reads (one JSON line per event, to
``OUT_DIR/attempt-<round>-<port>.jsonl``), with one round of the rendezvous (its number and its
store's port) as one attempt:

* ``formed`` for each group this worker formed (its round, ``start``: the step it healed to,
  ``role``: source, receiver or level);
* ``step`` after each committed step (``step`` counts from 1), with the parameter checksum
  all-reduced at the start of the step (``equal``: every rank had the same parameters) and this
  rank's checksum after the step (``sum``);
* ``done`` after the last step.

Each line carries ``attempt`` (``round-<n>-<port>``), ``restart`` (the round's restart count),
``rank``, ``world``, ``node`` (``$CHAOS_NODE``), ``pid`` and ``time`` (wall clock).
"""

from __future__ import annotations

import time

STARTED = time.time()

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "worker" / "workers"))
from live_model import LR, make_model, shard  # noqa: E402

from elastic.worker import LiveOptions, LiveTraining  # noqa: E402

OPTIONS = LiveOptions(collective_timeout=10, store_timeout=5, form_timeout=30, round_wait_timeout=90,
                      interrupt_grace=0.5, drain_timeout=10)
"""A peer cut off or frozen costs a collective at most 10 s; a round may take the longest etcd fault (30 s) and more."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-seconds", type=float, default=0.25)
    return parser.parse_args()


class Recorder:
    """Appends this worker's lines to one file per round (one ``write`` on an ``O_APPEND`` file)."""

    def __init__(self, out_dir: Path, node: str) -> None:
        self.out_dir = out_dir
        self.node = node
        self.wall_offset = time.time() - time.monotonic()

    def write(self, live: LiveTraining, event: str, at: float | None = None, round: int | None = None,
              **values: object) -> None:
        current = live.round
        number = current.round if round is None else round
        # A round is its number and its store: after an operator deleted the job's keys the
        # rendezvous numbers its rounds from 0 again, each on a new master port.
        port = current.master_port if number == current.round else 0
        line = json.dumps({"event": event, "attempt": f"round-{number}-{port}", "restart": current.restart_count,
                           "rank": live.rank, "world": live.world_size, "node": self.node, "pid": os.getpid(),
                           **values, "time": time.time() if at is None else at + self.wall_offset}) + "\n"
        fd = os.open(self.out_dir / f"attempt-{number:04d}-{port}.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                     0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def main() -> int:
    args = parse_args()
    model = make_model(int(os.environ.get("RANK", "0")))  # different per rank: the first heal equalises
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def state_dict() -> dict:
        return {"model": model.state_dict(), "opt": opt.state_dict()}

    def load_state_dict(state: dict) -> None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])

    def checksum() -> torch.Tensor:
        flat = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
        return torch.stack([flat.sum(), (flat * flat).sum()])

    recorder = Recorder(args.out_dir, os.environ.get("CHAOS_NODE", "?"))
    seen = 0

    def write_recoveries(live: LiveTraining) -> None:
        nonlocal seen
        for recovery in list(live.recoveries)[seen:]:
            recorder.write(live, "formed", at=recovery.healed, round=recovery.round, start=recovery.step,
                           role=recovery.role.value, cause=recovery.cause.value, worker_started=STARTED,
                           **{key: value for key, value in dataclasses.asdict(recovery).items()
                              if key in ("began", "formed", "nbytes", "generation")})
        seen = len(live.recoveries)

    with LiveTraining(state_dict, load_state_dict, options=OPTIONS) as live:
        ddp = live.ddp(model)
        while live.step < args.steps:
            write_recoveries(live)
            with live.train_step():
                step = live.step
                mine = checksum()
                high = live.all_reduce(mine.clone(), dist.ReduceOp.MAX)
                low = -live.all_reduce(-mine, dist.ReduceOp.MAX)
                x, y = shard(step, live.rank, live.world_size)
                time.sleep(args.step_seconds)
                opt.zero_grad()
                F.mse_loss(ddp(x), y).backward()
                opt.step()
            if live.step == step + 1:  # committed
                recorder.write(live, "step", step=live.step, equal=bool(torch.equal(high, low)),
                               sum=float(checksum()[0]))
        write_recoveries(live)
        recorder.write(live, "done", step=live.step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
