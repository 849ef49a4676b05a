"""A small training under live recovery, written as docs/live-recovery.md shows.

Run it on one machine with two workers:

    elasticrun --standalone --nproc-per-node=2 --live-recovery examples/train_live.py

or on several machines against etcd (same command on every node):

    elasticrun --nnodes=1:4 --nproc-per-node=8 --live-recovery --rdzv-backend=etcd \\
        --rdzv-endpoint=etcd-0:2379 --rdzv-id=demo examples/train_live.py --checkpoint /data/live.pt

It fits a small MLP with dropout to synthetic data dealt by an ElasticLoader (random
augmentation, gradient accumulation), with an LR schedule, gradient clipping and AMP's
GradScaler where it applies (CUDA; live recovery runs on gloo, so the model stays on the CPU
here and the scaler is off). ``live.run`` yields once per committed step: the scheduler steps
and the loss is printed there, exactly once per step on every rank. A worker that crashes, or a
node that joins, receives the whole state (model, optimizer, scheduler, scaler, step, data
position; the random generators follow from the step) from a live peer, without a checkpoint.

The checkpoint is for a restart of the whole job: with ``--checkpoint PATH`` local rank 0 of
every node writes its node's copy every ``--checkpoint-every`` committed steps (atomically).
At start every worker that finds the file loads it (``live.load_state_dict``) and the first
heal brings every rank to the newest step any of them loaded: machines need not share it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile

import torch
import torch.nn.functional as F
import torch.utils.data as tud

from elastic.worker import ElasticLoader, LiveTraining


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="committed steps to train (default 300)")
    parser.add_argument("--checkpoint", default=None, help="this node's checkpoint file (default: none)")
    parser.add_argument("--checkpoint-every", type=int, default=50, help="committed steps between checkpoints")
    parser.add_argument("--log-every", type=int, default=10, help="committed steps between loss lines")
    return parser.parse_args()


class Synthetic(tud.Dataset):
    """y = x . w + 0.5 for a fixed x per index; the augmentation adds noise to x."""

    def __init__(self, length: int = 4096) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(length, 16, generator=generator)
        self.y = self.x @ (torch.arange(16.0) / 16).unsqueeze(1) + 0.5

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index] + 0.01 * torch.randn(16), self.y[index]  # seeded per sample by the loader


def save(path: str, state: dict) -> None:
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".checkpoint-")
    try:
        with os.fdopen(fd, "wb") as out:
            torch.save(state, out)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 20))  # a warm-up
    scaler = torch.amp.GradScaler("cuda", enabled=False)  # enabled=True with fp16 autocast on a GPU
    loader = ElasticLoader(Synthetic(), batch_size=16, accumulation=2, num_workers=1, seed=0)
    live = LiveTraining(state={"model": model, "opt": opt, "sched": sched, "scaler": scaler})
    if args.checkpoint and os.path.exists(args.checkpoint):
        live.load_state_dict(torch.load(args.checkpoint, weights_only=True))  # tensors and numbers, no code

    def train_step(step):  # run again when not committed: change state only after the last collective
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for i, micro in enumerate(step.batches):
            x, y = micro.data
            with ddp.no_sync() if i < len(step.batches) - 1 else contextlib.nullcontext():
                loss = F.mse_loss(ddp(x), y) * micro.weight
                scaler.scale(loss).backward()
            total += loss.item()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)  # the optimizer step last
        scaler.update()
        return total

    with live, loader:
        ddp = live.ddp(model)
        print(f"rank {live.rank} of {live.world_size}: starting at step {live.step}", flush=True)
        for done in live.run(train_step, data=loader, until=args.steps):
            sched.step()  # exactly once per committed step, on every rank
            if live.rank == 0 and (done.step + 1) % args.log_every == 0:
                print(f"step {done.step + 1}/{args.steps} loss {done.result:.5f} lr {sched.get_last_lr()[0]:.2e} "
                      f"(world {done.world_size})", flush=True)
            if args.checkpoint and live.local_rank == 0 and (live.step % args.checkpoint_every == 0 or live.step == args.steps):
                save(args.checkpoint, live.state_dict())
        print(f"rank {live.rank}: done at step {live.step}", flush=True)


if __name__ == "__main__":
    main()
