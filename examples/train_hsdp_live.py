"""The real-loop example's model sharded with FSDP2 inside each node, replicated across nodes,
under live recovery (HSDP; docs/live-recovery.md, "Sharded models").

Run it on 2 nodes of 2 workers each against etcd (same command on every node):

    elasticrun --nnodes=1:2 --nproc-per-node=2 --live-recovery --rdzv-backend=etcd \\
        --rdzv-endpoint=127.0.0.1:2379 --rdzv-id=hsdp examples/train_hsdp_live.py --steps 300

Each node's workers shard one replica of the model over their own gloo group
(:func:`elastic.worker.hsdp.form_shard_group`); each rank trains on its own micro-batches and,
after backward, averages its gradient shard over the replicas on the live group
(``LiveOptions(hsdp=True)``: groups form with whole replicas). A replica whose worker crashes
(its partners exit too), or a node that comes back, heals shard by shard from a live replica:
each rank receives its own shard (parameters and AdamW state) and the scheduler, step and data
position from the rank holding the same shard index. At the end every rank prints

    rank R done: step S, lr L, shard I of M, params P

with ``P`` a hex checksum of its local shard: ranks with the same shard index print the same.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

from elastic.worker import ElasticLoader, LiveOptions, LiveTraining
from elastic.worker import hsdp


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="committed steps to train (default 300)")
    parser.add_argument("--log-every", type=int, default=10, help="committed steps between loss lines")
    parser.add_argument("--step-time", type=float, default=0.0, help="seconds each step sleeps (a slower model)")
    parser.add_argument("--hidden", type=int, default=64, help="the hidden layer's width (default 64; "
                        "benchmarks/hsdp_heal.py makes the model ~100 MB of state with it)")
    parser.add_argument("--events", default=None, help="a directory: each worker writes <pid>.jsonl there, a line "
                        "per committed step and per recovery (for tests and measurements)")
    return parser.parse_args()


class Synthetic(torch.utils.data.Dataset):
    """y = x . w + 0.5 for a fixed x per index; the augmentation adds noise to x."""

    def __init__(self, length: int = 4096) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(length, 16, generator=generator)
        self.y = self.x @ (torch.arange(16.0) / 16).unsqueeze(1) + 0.5

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index] + 0.01 * torch.randn(16), self.y[index]


def main() -> None:
    args = parse_args()
    shards = hsdp.form_shard_group()  # this node's workers: one replica, fixed for its life
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, args.hidden), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(args.hidden, 1))
    for layer in (model[0], model[3]):
        fully_shard(layer, mesh=shards.mesh)
    fully_shard(model, mesh=shards.mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 20))  # a warm-up
    loader = ElasticLoader(Synthetic(), batch_size=8, accumulation=2, seed=0)
    state = {"model": hsdp.ShardState(model), "opt": hsdp.OptimizerShardState(opt), "sched": sched}
    live = LiveTraining(state=state, options=LiveOptions(hsdp=True), on_reform=shards.register)

    def train_step(step):  # run again when not committed: the optimizer step last
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for micro in step.batches:
            x, y = micro.data
            loss = F.mse_loss(model(x), y) * micro.weight
            loss.backward()  # FSDP2 reduce-scatters over the shard group
            total += loss.item()
        hsdp.average_gradients(live, model, shards)  # the shard over the replicas, on the live group
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if args.step_time:
            time.sleep(args.step_time)
        opt.step()
        return total

    events = open(os.path.join(args.events, f"{os.getpid()}.jsonl"), "a") if args.events else None

    def event(**fields) -> None:
        if events is not None:
            events.write(json.dumps({"t": time.monotonic(), "pid": os.getpid(), **fields}) + "\n")
            events.flush()

    reported: set[int] = set()

    def report_recoveries() -> None:
        for recovery in live.recoveries:
            if events is not None and id(recovery) not in reported:
                reported.add(id(recovery))
                event(ev="recovery", round=recovery.round, generation=recovery.generation, cause=recovery.cause.value,
                      role=recovery.role.value, step=recovery.step, nbytes=recovery.nbytes, began=recovery.began,
                      formed=recovery.formed, healed=recovery.healed)

    with shards, live, loader:
        rank = live.round.rank
        print(f"rank {rank}: shard {shards.index} of {shards.size} (shard group {shards.generation}), "
              f"starting at step {live.step}", flush=True)
        event(ev="start", rank=rank, shard=shards.index, step=live.step)
        for done in live.run(train_step, data=loader, until=args.steps):
            sched.step()  # exactly once per committed step, on every rank
            event(ev="step", step=done.step, world=done.world_size)
            report_recoveries()
            if live.rank == 0 and (done.step + 1) % args.log_every == 0:
                print(f"step {done.step + 1}/{args.steps} loss {done.result:.5f} lr {sched.get_last_lr()[0]:.2e} "
                      f"(replicas {done.world_size // shards.size})", flush=True)
        report_recoveries()
        line = (f"rank {live.round.rank} done: step {live.step}, lr {sched.get_last_lr()[0]:.6e}, shard {shards.index} "
                f"of {shards.size}, params {hsdp.shard_checksum(model)}")
        event(ev="done", line=line)
        print(line, flush=True)


if __name__ == "__main__":
    main()
