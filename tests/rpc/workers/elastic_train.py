"""A two-stage pipeline trained under ``elasticrun``, checkpointing every step, reporting as it goes.

    elastic_train.py REPORTS CKPT_DIR --steps N [--step-delay S]

Two workers (one role): rank 0 drives and holds stage 0, rank 1 holds stage 1. Each attempt
reports (JSON lines, see ``tests/agent/workers/_report.py``) ``started`` (before torch is
imported), ``rpc_up`` with its RPC name and init method, then rank 0 reports ``resumed`` with
the step restored from the checkpoint, ``step`` after each saved step, and ``finished`` with
the final parameters. The test kills a worker mid-training and checks the next attempt.
"""

from __future__ import annotations

import time

STARTED = time.time()

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "agent" / "workers"))
from _report import report  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("checkpoint_dir")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--step-delay", type=float, default=0.0)
    args = parser.parse_args()
    report(args.out, "started", time=STARTED)

    import torch

    import rpc
    import toy

    with rpc.start() as session:
        report(args.out, "rpc_up", name=session.name, init_method=session.init_method)
        if session.rank != 0:
            return 0  # serve stage 1 until the driver is done (the graceful shutdown waits)
        pipe = rpc.Pipeline(toy.make_model(seed=0), rpc.workers(session.env.role))
        modules = pipe.modules()
        start = rpc.checkpoint.restore(args.checkpoint_dir, modules)
        shards = sorted(os.listdir(args.checkpoint_dir)) if os.path.isdir(args.checkpoint_dir) else []
        report(args.out, "resumed", step=start, shards=shards)
        optimizer = rpc.distributed_optimizer(torch.optim.SGD, pipe.parameter_rrefs(), lr=toy.LR)
        for step in range(start, args.steps):
            x, y = toy.batch(step)
            loss = rpc.train_step(lambda: toy.loss_fn(pipe(x), y), optimizer)
            rpc.checkpoint.save(args.checkpoint_dir, step + 1, modules)
            report(args.out, "step", step=step + 1, loss=float(loss))
            time.sleep(args.step_delay)
        report(args.out, "finished", step=args.steps, state=toy.as_lists(pipe.state_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
