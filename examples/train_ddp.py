"""A small DistributedDataParallel training that survives elastic restarts.

Run it on one machine with two workers:

    elasticrun --standalone --nproc-per-node=2 examples/train_ddp.py

or on several machines against etcd (same command on every node):

    elasticrun --nnodes=2:4 --nproc-per-node=8 --rdzv-backend=etcd \\
        --rdzv-endpoint=etcd-0:2379 --rdzv-id=demo examples/train_ddp.py --steps 2000

It fits a linear model to synthetic data (gloo on CPU, NCCL when CUDA is present), saves a
checkpoint every ``--checkpoint-every`` steps (local rank 0 of every node writes its node's
copy, atomically), and after a restart — a crashed worker, a lost or added node — resumes from
the newest checkpoint with whatever world size the new round has. It prints the loss as it
goes and ``done: ...`` at the end.

The checkpoint is per run (``<tmp>/elastic-train-ddp-<uid>/<run id>.pt``): a new
``--standalone`` run (a new run id) starts from scratch. Machines need not share it: each reads
its own copy, the ranks all-gather the steps they found, and the rank with the newest checkpoint
broadcasts its model, optimizer state and step to all the others before the first step, so every
rank of a world resumes at the same step with the same parameters (a node that rejoins with an
old copy, or none, takes the newest). Every rank says where it resumes. The directory is private
to the user (0700, checked): in a world-writable ``/tmp`` another user could otherwise plant a
checkpoint under the predictable name, and ``ps`` shows the run id.

At the end it destroys its process group for good, so that gloo's threads are joined before the
interpreter exits. ``destroy_process_group()`` alone does not end a group that something still
refers to: DDP does (through reference cycles), and so does ``torch.distributed.nn`` when it is
first imported after the group exists (DDP's construction imports it; the ``group=`` defaults of
its functions keep the group). A gloo thread that drops the last collective of a backward pass
(it holds a Python object) while the interpreter finalizes aborts the process (SIGABRT,
"terminate called without an active exception"), rarely, on a loaded machine. So the example
imports ``torch.distributed.nn`` before the group exists, and collects DDP before destroying it.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import stat
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.nn  # before the group exists: see the module docstring
from torch.nn.parallel import DistributedDataParallel


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="total optimizer steps (default 200)")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per worker per step")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    parser.add_argument("--checkpoint", default=os.environ.get("CHECKPOINT_PATH"),
                        help="this node's checkpoint file (default <tmp>/elastic-train-ddp-<uid>/<run id>.pt); "
                             "nodes need not share it")
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep per step (for demos)")
    args = parser.parse_args()
    if args.checkpoint is None:
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none").replace("/", "_")
        args.checkpoint = os.path.join(private_dir(), f"{run_id}.pt")
    return args


def private_dir() -> str:
    """``<tmp>/elastic-train-ddp-<uid>``, created 0700 if missing; exits with one line if it is not
    a directory of this user that only this user can write (someone else made it first)."""
    path = os.path.join(tempfile.gettempdir(), f"elastic-train-ddp-{os.geteuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        sys.exit(f"train_ddp: {path} is not a private directory of this user (owner uid {info.st_uid}, mode "
                 f"{stat.S_IMODE(info.st_mode):o}); remove it or pass --checkpoint (or CHECKPOINT_PATH)")
    return path


def synthetic_batch(step: int, rank: int, batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic data for (step, rank): y = x @ w_true + 0.5 plus a little noise."""
    generator = torch.Generator().manual_seed(step * 100_003 + rank)
    x = torch.randn(batch_size, 16, generator=generator)
    w_true = torch.arange(16, dtype=torch.float32).unsqueeze(1) / 16
    y = x @ w_true + 0.5 + 0.01 * torch.randn(batch_size, 1, generator=generator)
    return x.to(device), y.to(device)


def load_checkpoint(path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    if not os.path.exists(path):
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)  # tensors and numbers only, never code
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def agree_on_checkpoint(model: torch.nn.Module, optimizer: torch.optim.Optimizer, local_step: int,
                        device: torch.device) -> tuple[int, int]:
    """Make every rank resume from the newest checkpoint any rank found; returns ``(step, source rank)``.

    Each rank loaded its own node's checkpoint (``local_step``; 0: none). The ranks all-gather
    those steps; the newest wins (the lowest rank among equals), and its rank broadcasts the
    model's tensors, the optimizer's state and the step. Why not "rank 0 decides": after a
    whole-world restart rank 0 can be a machine that lost its disk or never had a checkpoint,
    and training would start over from step 0 although another machine holds the newest state.
    """
    world = dist.get_world_size()
    steps = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]
    dist.all_gather(steps, torch.tensor([local_step], dtype=torch.long, device=device))
    found = [int(step.item()) for step in steps]
    source = max(range(world), key=lambda rank: (found[rank], -rank))
    if found[source] == 0:
        return 0, source  # nobody has a checkpoint: DDP gives every rank rank 0's initial parameters
    for tensor in model.state_dict().values():
        dist.broadcast(tensor, src=source)
    state = [optimizer.state_dict() if dist.get_rank() == source else None]
    dist.broadcast_object_list(state, src=source, device=device if device.type == "cuda" else None)
    optimizer.load_state_dict(state[0])
    return found[source], source


def parameters_digest(model: torch.nn.Module) -> str:
    """A short digest of the model's parameters (equal on every rank of a consistent world)."""
    digest = hashlib.sha1()
    for tensor in model.state_dict().values():
        digest.update(repr(tensor.detach().cpu().flatten().tolist()).encode())
    return digest.hexdigest()[:12]


def save_checkpoint(path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    # a new file beside it (mkstemp: exclusive, never through a planted link), then renamed over it
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".checkpoint-")
    try:
        with os.fdopen(fd, "wb") as out:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, out)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def main() -> None:
    args = parse_args()
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    local_step = load_checkpoint(args.checkpoint, model, optimizer)
    start, source = agree_on_checkpoint(model, optimizer, local_step, device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    resumed = f", resumed from rank {source}'s checkpoint (this node's: step {local_step})" if start else ""
    print(f"rank {rank} of {world}: starting at step {start} (restart count {restart}{resumed}; parameters "
          f"{parameters_digest(model)})", flush=True)
    loss = None
    for step in range(start, args.steps):
        x, y = synthetic_batch(step, rank, args.batch_size, device)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if args.step_delay:
            time.sleep(args.step_delay)
        done = step + 1
        if done % args.checkpoint_every == 0 or done == args.steps:
            if local_rank == 0:  # every machine keeps its own copy
                save_checkpoint(args.checkpoint, model, optimizer, done)
            if rank == 0:
                print(f"step {done}/{args.steps} loss {loss.item():.5f} (world {world})", flush=True)
            dist.barrier()
    if rank == 0 and loss is None:
        print(f"done: nothing to train, {args.checkpoint} is already at step {start} of {args.steps}", flush=True)
    elif rank == 0:
        print(f"done: {args.steps} steps, final loss {loss.item():.5f}, world size {world}", flush=True)
    del ddp
    gc.collect()  # DDP's reference cycles: the group must have no other holder (see the module docstring)
    dist.destroy_process_group()  # ends the group and joins gloo's threads


if __name__ == "__main__":
    main()
