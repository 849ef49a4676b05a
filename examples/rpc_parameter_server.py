"""Parameter-server training with distributed autograd over RPC, resumable after restarts.

Run it on one machine with a parameter server and two trainers:

    elasticrun --standalone --nproc-per-node 3 --max-restarts 1 examples/rpc_parameter_server.py --steps 50

Rank 0 is the parameter server: it holds the model. Every other rank is a trainer: it runs
the forward on the server (``rpc.RemoteModule``), the loss locally, the backward across both
(``rpc.train_step``), and steps the server's parameters with a ``DistributedOptimizer`` —
asynchronously, each trainer on its own data shard, as in PyTorch's parameter-server tutorial.
Each step's gradients live in its own distributed autograd context, so concurrent trainers do
not mix theirs, and each forward works on copies of the parameters (``HogwildRegressor``),
so one trainer's step cannot invalidate another's backward.

Trainer 1 checkpoints the model every ``--checkpoint-every`` steps (the server writes its own
file, ``rpc.checkpoint``); after a restart the server loads it when the first trainer asks for
the model, and every trainer resumes from that step. ``--crash-at-step K`` makes trainer 1 fail
once at step K on the first attempt.

(torch 2.13's ``DistributedOptimizer`` prints a ``DeprecationWarning`` about TorchScript on the
server, with the filter forced to "always"; it is harmless.)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading

import torch
from torch import nn
from torch.distributed.rpc import RRef, rpc_sync

import rpc

# -- on the parameter server (module level: trainers call these by name over RPC) -------------

_model: nn.Module | None = None
_model_step = 0
_model_lock = threading.Lock()


class HogwildRegressor(nn.Module):
    """A two-layer regressor whose forward computes on copies of its parameters.

    Trainers step the shared parameters in place while other trainers' backward passes are
    still to run; a backward that saved the parameters themselves would then fail ("modified by
    an inplace operation"). Each forward saves differentiable copies instead (``clone``), so it
    sees the parameters as they were at its start (Hogwild) while the gradients still reach
    them. The forward reads the parameters and never swaps them (``torch.func.functional_call``
    would): trainers run forwards on the server concurrently, and a swap seen by another
    trainer's ``parameter_rrefs()`` or checkpoint hands it a copy instead of the parameter.
    """

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(16, 32)
        self.out = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(nn.functional.linear(x, self.hidden.weight.clone(), self.hidden.bias.clone()))
        return nn.functional.linear(hidden, self.out.weight.clone(), self.out.bias.clone())


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return HogwildRegressor()


def model_and_step(checkpoint_dir: str) -> tuple[RRef, int]:
    """The server's model (built, and restored from its newest checkpoint, on first use) and its step."""
    global _model, _model_step
    with _model_lock:
        if _model is None:
            _model = make_model()
            _model_step = rpc.checkpoint.restore_local(checkpoint_dir, {"model": _model})
        return RRef(_model), _model_step


# -- on a trainer ------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "local")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="steps per trainer (default 100)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints (default 10)")
    default_dir = os.path.join(tempfile.gettempdir(), f"elastic-rpc-ps-{run_id}")
    parser.add_argument("--checkpoint-dir", default=default_dir,
                        help="where the server writes the model (default: per run id, in the temp dir)")
    parser.add_argument("--crash-at-step", type=int, default=0, help="trainer 1 fails once at this step")
    return parser.parse_args()


def synthetic_batch(step: int, shard: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic data for (step, shard): y = x . w + 0.3."""
    generator = torch.Generator().manual_seed(step * 1_000 + shard)
    x = torch.randn(batch_size, 16, generator=generator)
    return x, (x @ torch.linspace(-1, 1, 16)).unsqueeze(1) + 0.3


def train(session: rpc.RpcSession, args: argparse.Namespace) -> None:
    server = rpc.worker(session.env.role, 0)
    model_rref, start = rpc_sync(server, model_and_step, (args.checkpoint_dir,))
    model = rpc.RemoteModule.from_rref(model_rref)
    optimizer = rpc.distributed_optimizer(torch.optim.SGD, model.parameter_rrefs(), lr=args.lr)
    lead = session.rank == 1
    restart = session.env.restart_count
    print(f"{session.name}: training {model} from step {start} (restart count {restart})", flush=True)
    loss = torch.tensor(float("nan"))
    for step in range(start, args.steps):
        x, y = synthetic_batch(step, session.rank, args.batch_size)
        loss = rpc.train_step(lambda: nn.functional.mse_loss(model(x), y), optimizer)
        done = step + 1
        if lead and (done % args.checkpoint_every == 0 or done == args.steps):
            rpc.checkpoint.save(args.checkpoint_dir, done, {"model": model})
            print(f"step {done}/{args.steps} loss {loss.item():.5f} (checkpointed)", flush=True)
        if lead and done == args.crash_at_step and restart == 0:
            print(f"{session.name}: failing on purpose at step {done}", flush=True)
            os._exit(1)
    print(f"{session.name} done: {args.steps} steps (restart count {restart}), final loss {loss.item():.5f}",
          flush=True)


def main() -> None:
    args = parse_args()
    with rpc.start() as session:
        if session.rank > 0:
            train(session, args)
        # the server serves until every trainer is done: the graceful shutdown waits for them
    if session.rank == 0:
        print(f"done: parameter server {session.name} served {session.world_size - 1} trainers", flush=True)


if __name__ == "__main__":
    main()
