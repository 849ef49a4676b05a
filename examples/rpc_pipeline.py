"""A two-stage pipeline trained with distributed autograd over RPC, resumable after restarts.

Run it on one machine with three workers (a driver and two stages):

    elasticrun --standalone --nproc-per-node 3 --max-restarts 1 examples/rpc_pipeline.py --steps 50

Rank 0 drives: it splits an ``nn.Sequential`` into one stage per other rank (``rpc.Pipeline``),
feeds micro-batches through the stages (each stage fetches its input from the previous one; only
the output comes back), runs the backward across the stages (``rpc.train_step``) and steps each
stage's parameters on its owner (``DistributedOptimizer``). Every ``--checkpoint-every`` steps
each stage's owner saves its own parameters (``rpc.checkpoint``); after a restart the job
resumes from the newest step all owners have. ``--crash-at-step K`` makes the driver fail once
at step K on the first attempt, to watch that happen. ``--show-graph`` prints the distributed
autograd graph of the first step.

(torch 2.13's ``DistributedOptimizer`` prints a ``DeprecationWarning`` about TorchScript on every
owner, with the filter forced to "always"; it is harmless.)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
from torch import nn

import rpc


def parse_args() -> argparse.Namespace:
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "local")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="total optimizer steps (default 100)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=4, help="micro-batches per step (default 4)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints (default 10)")
    default_dir = os.path.join(tempfile.gettempdir(), f"elastic-rpc-pipeline-{run_id}")
    parser.add_argument("--checkpoint-dir", default=default_dir,
                        help="where each owner writes its stage (default: per run id, in the temp dir)")
    parser.add_argument("--crash-at-step", type=int, default=0, help="fail once at this step on the first attempt")
    parser.add_argument("--show-graph", action="store_true", help="print the autograd graph of the first step")
    return parser.parse_args()


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


def synthetic_batch(step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic data for a step: y = sin(x . w) plus a little noise."""
    generator = torch.Generator().manual_seed(step)
    x = torch.randn(batch_size, 16, generator=generator)
    w = torch.linspace(-1, 1, 16)
    return x, torch.sin(x @ w).unsqueeze(1) + 0.01 * torch.randn(batch_size, 1, generator=generator)


def drive(session: rpc.RpcSession, args: argparse.Namespace) -> None:
    stages = [info for info in rpc.workers(session.env.role) if info.id != session.rank] or [rpc.worker_infos()[0]]
    pipe = rpc.Pipeline(make_model(), stages, microbatches=args.microbatches)
    modules = pipe.modules()
    start = rpc.checkpoint.restore(args.checkpoint_dir, modules)
    restart = session.env.restart_count
    print(f"{session.name}: {pipe}; starting at step {start} (restart count {restart}, rpc via "
          f"{session.env.master_addr}:{session.env.master_port})", flush=True)
    optimizer = rpc.distributed_optimizer(torch.optim.SGD, pipe.parameter_rrefs(), lr=args.lr)
    loss = torch.tensor(float("nan"))
    started = time.monotonic()
    for step in range(start, args.steps):
        x, y = synthetic_batch(step, args.batch_size)
        if args.show_graph and step == start:
            with rpc.distributed_step() as first:
                loss = nn.functional.mse_loss(pipe(x), y)
                print(rpc.autograd_graph(loss).text(), flush=True)
                first.backward(loss)
                first.step(optimizer)
        else:
            loss = rpc.train_step(lambda: nn.functional.mse_loss(pipe(x), y), optimizer)
        done = step + 1
        if done % args.checkpoint_every == 0 or done == args.steps:
            rpc.checkpoint.save(args.checkpoint_dir, done, modules)
            print(f"step {done}/{args.steps} loss {loss.item():.5f} (checkpointed)", flush=True)
        if done == args.crash_at_step and restart == 0:
            print(f"{session.name}: failing on purpose at step {done}", flush=True)
            os._exit(1)
    seconds = time.monotonic() - started
    print(f"done: {args.steps} steps, final loss {loss.item():.5f}, {len(stages)} stages, {seconds:.1f}s", flush=True)


def main() -> None:
    args = parse_args()
    with rpc.start() as session:
        if session.rank == 0:
            drive(session, args)
        # the stages serve RPCs until the driver is done: the graceful shutdown waits for it


if __name__ == "__main__":
    main()
