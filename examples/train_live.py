"""A small byte-level transformer language model trained under live recovery: a loop to copy.

On one machine with two workers:

    elasticrun --standalone --nproc-per-node=2 --live-recovery examples/train_live.py

or on several machines against etcd (the same command on every node):

    elasticrun --nnodes=1:4 --nproc-per-node=8 --live-recovery --rdzv-backend=etcd \\
        --rdzv-endpoint=etcd-0:2379 --rdzv-id=demo --rdzv-conf=rejoin_timeout=0.2 \\
        examples/train_live.py --checkpoint /data/live.pt

It learns to predict the next byte of a text (the repository's README.md, or ``--text PATH``)
cut into windows, which an ``ElasticLoader`` deals to the ranks (two DataLoader workers each):
every window of an epoch is used once whatever the world does. AdamW, a warm-up then a cosine
LR, gradient accumulation, clipping. A restarted worker, or a node that joins, receives the
whole state (model, optimizer, scheduler, scaler, sample count, step, data position) from a
live peer; the checkpoint (``--checkpoint``) is only for a restart of the whole job.

At the end every rank prints ``rank R done: step S, lr L, samples K, params P``: S the steps
committed, L the learning rate, K the samples (windows) used by the committed steps over all
ranks since step 0 (training state, so the same on every rank), P a checksum of the
parameters. Every rank of a run prints the same S, L, K and P, whatever failed on the way.
``--record DIR`` makes each rank append to its own file in DIR one JSON line per step it
committed: the step, its rank and world, the epoch, the samples of the step (all ranks), the
indices of those this rank used, the checksum, a ``time.monotonic()``; enough to check from
outside that no sample of an epoch was used twice or skipped, and no step committed twice.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import torch.utils.data as tud
from torch import nn

from elastic.worker import ElasticLoader, LiveTraining

TEXT = Path(__file__).resolve().parents[1] / "README.md"  # ships with the repository (and its image)
CONTEXT = 64  # bytes a window predicts


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="committed steps to train, the LR schedule's length")
    parser.add_argument("--text", type=Path, default=TEXT, help="the text to learn (default: the repository's README)")
    parser.add_argument("--checkpoint", default=None, help="this node's checkpoint file (default: none)")
    parser.add_argument("--checkpoint-every", type=int, default=50, help="committed steps between checkpoints")
    parser.add_argument("--log-every", type=int, default=10, help="committed steps between loss lines")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (slower than fp32 on most CPUs)")
    parser.add_argument("--record", type=Path, default=None, help="a directory for one JSON line per committed step")
    return parser.parse_args()


class TextWindows(tud.Dataset):
    """A text's bytes cut into windows of CONTEXT + 1; sample i is window i's inputs, its targets
    (the same bytes shifted by one) and i itself (for ``--record``)."""

    def __init__(self, path: Path) -> None:
        try:
            data = path.read_bytes()
        except OSError as error:
            sys.exit(f"train_live.py: cannot read the text {path} ({error.strerror}); give one with --text PATH")
        self.tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()  # bytes: 256 tokens
        if len(self) < 1:
            sys.exit(f"train_live.py: {path} has {len(data)} bytes, fewer than a window's {CONTEXT + 1}")

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // CONTEXT

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        window = self.tokens[i * CONTEXT:(i + 1) * CONTEXT + 1]
        return window[:-1], window[1:], i


class TinyGPT(nn.Module):
    """A decoder-only transformer: byte and position embeddings, pre-norm causal blocks, and a
    head tied to the byte embedding (120k parameters)."""

    def __init__(self, width: int = 64, heads: int = 4, layers: int = 2, dropout: float = 0.1) -> None:
        super().__init__()
        self.embed, self.position = nn.Embedding(256, width), nn.Embedding(CONTEXT, width)
        for embedding in (self.embed, self.position):  # small, as in GPT-2: the tied head starts near uniform
            nn.init.normal_(embedding.weight, std=0.02)
        block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 256, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(CONTEXT), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.position.weight[:x.shape[1]]
        h = self.blocks(h, mask=self.mask[:x.shape[1], :x.shape[1]], is_causal=True)
        return self.head(self.norm(h))


def warmup_cosine(warmup: int, total: int, floor: float = 0.1):
    """The LR factor of step s (LambdaLR's): linear up to 1 over ``warmup`` steps, then a cosine
    down to ``floor`` at ``total``."""
    def factor(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, (s - warmup) / max(1, total - warmup))))
    return factor


class Samples:
    """Samples used by the committed steps, over all ranks. Registered as state like the model:
    any object with ``state_dict`` and ``load_state_dict`` travels to joiners and checkpoints."""

    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> dict[str, int]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.count = state["count"]


def checksum(model: nn.Module) -> str:
    digest = hashlib.blake2b(digest_size=8)
    for parameter in model.parameters():
        digest.update(parameter.detach().numpy())
    return digest.hexdigest()


def save(path: str, state: dict) -> None:
    """Write ``state`` to ``path`` atomically: a crash mid-write leaves the previous checkpoint."""
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".checkpoint-")
    try:
        with os.fdopen(fd, "wb") as out:
            torch.save(state, out)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def open_record(directory: Path | None):
    """This process's ``--record`` file (line-buffered: one write per line), or nothing."""
    if directory is None:
        return contextlib.nullcontext()
    directory.mkdir(parents=True, exist_ok=True)
    return open(directory / f"{socket.gethostname()}-{os.getpid()}.jsonl", "a", buffering=1)


def main() -> None:
    args = parse_args()
    dataset = TextWindows(args.text)
    torch.manual_seed(0)  # the same initial model on every rank
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(min(50, args.steps // 10 + 1), args.steps))
    # AMP: on a GPU, fp16 autocast and the scaler enabled. Live recovery runs on gloo, so the model
    # stays on the CPU, where bf16 autocast needs no scaler; registered anyway, its state travels.
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    samples = Samples()
    # 8 windows per micro-batch, 2 micro-batches per rank and step: the global batch, 16 per rank,
    # follows the world (give global_batch= instead of accumulation= to keep it fixed).
    loader = ElasticLoader(dataset, batch_size=8, accumulation=2, num_workers=2, seed=0)
    live = LiveTraining(state={"model": model, "opt": opt, "sched": sched, "scaler": scaler, "samples": samples})
    if args.checkpoint and os.path.exists(args.checkpoint):
        # before start: the first heal brings every rank to the newest step any of them loaded
        live.load_state_dict(torch.load(args.checkpoint, weights_only=True))

    def train_step(step):
        """One attempt of a step: this rank's micro-batches, one optimizer step. An attempt whose
        group fails runs again (the same batches in the same world, the new world's share of the
        same samples otherwise): change the training state only after the last collective."""
        opt.zero_grad(set_to_none=True)
        loss, used = torch.zeros(()), []
        for i, micro in enumerate(step.batches):
            x, y, index = micro.data
            # gradients are all-reduced (averaged over the ranks) at the last micro-batch only
            with ddp.no_sync() if i < len(step.batches) - 1 else contextlib.nullcontext():
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                    # micro.weight: this micro-batch's share of the step's samples (0 for a filler)
                    part = F.cross_entropy(ddp(x).flatten(0, 1), y.flatten()) * micro.weight
                scaler.scale(part).backward()
            loss += part.detach()
            if micro.samples:  # 0: a filler at an epoch's end, which adds nothing
                used += index.tolist()
        live.all_reduce(loss)  # collectives belong here, not in the for body
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        scaler.step(opt)  # the optimizer step last
        scaler.update()
        return loss.item() / step.world_size, loader.position.epoch, used

    with live, loader, open_record(args.record) as record:
        ddp = live.ddp(model)  # one DDP for every group to come
        print(f"rank {live.rank} of {live.world_size}: starting at step {live.step}", flush=True)
        for done in live.run(train_step, data=loader, until=args.steps):
            # once per committed step on every rank: the scheduler, counters, logs, checkpoints
            sched.step()
            samples.count += done.samples
            loss, epoch, used = done.result
            if done.rank == 0 and live.step % args.log_every == 0:
                print(f"step {live.step}/{args.steps} loss {loss:.3f} lr {sched.get_last_lr()[0]:.2e} "
                      f"world {done.world_size} epoch {epoch}", flush=True)
            if record:
                record.write(json.dumps({"step": done.step, "rank": done.rank, "world": done.world_size,
                                         "epoch": epoch, "samples": done.samples, "used": used,
                                         "params": checksum(model), "pid": os.getpid(), "t": time.monotonic()}) + "\n")
            if args.checkpoint and live.local_rank == 0 and (live.step % args.checkpoint_every == 0
                                                              or live.step == args.steps):
                save(args.checkpoint, live.state_dict())
        print(f"rank {live.rank} done: step {live.step}, lr {sched.get_last_lr()[0]:.6e}, samples {samples.count}, "
              f"params {checksum(model)}", flush=True)


if __name__ == "__main__":
    main()
