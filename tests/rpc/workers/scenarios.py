"""RPC scenarios run by real worker processes for ``tests/rpc``; each writes what it saw as JSON.

    scenarios.py SCENARIO OUT_DIR

The test starts one process per rank with the environment ``elasticrun`` gives (built by
``elastic.agent.worker_env``), sometimes with several roles. Each process joins RPC with
``rpc.start()``, runs ``SCENARIO`` and writes ``OUT_DIR/result-<RANK>.json``. Every function an
RPC names is defined at module level, before ``rpc.start()`` (a peer may call it at once).
Sub-checks of a scenario record their exception instead of aborting the others.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as trpc

import rpc
import toy

# -- functions run remotely --------------------------------------------------------------------


class FaultyLayer(torch.nn.Module):
    """A layer whose forward fails, to see how the error reaches the caller."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.check_input(x)

    def check_input(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError(f"faulty layer: refusing input of shape {list(x.shape)}")


def broken_factory() -> torch.nn.Module:
    raise RuntimeError("broken factory: cannot build this module")


def autograd_context_count() -> int:
    return int(dist_autograd._get_debug_info()["num_autograd_contexts"])


def touch(path: str) -> None:
    Path(path).write_text(str(os.getpid()))


# -- helpers -----------------------------------------------------------------------------------


def attempt(record: dict, key: str, check) -> None:
    """Run one sub-check; store its result, or its traceback under ``<key>_error``."""
    try:
        record[key] = check()
    except Exception:
        record[f"{key}_error"] = traceback.format_exc()


def info_dict(info: rpc.ContextInfo) -> dict:
    return dataclasses.asdict(info)


# -- scenarios ---------------------------------------------------------------------------------


def design_note(session: rpc.RpcSession, out: dict) -> None:
    """Both workers run the design note's step towards the other, then a step with three RPCs."""
    peer = rpc.worker("worker", 1 - session.env.role_rank).name
    out["peer"] = peer
    out["lookup"] = {"workers": [info.name for info in rpc.workers("worker")], "roles": rpc.roles()}
    torch.manual_seed(100 + session.rank)
    t1, t2, t4 = (torch.rand(3, 3, requires_grad=True) for _ in range(3))
    with rpc.distributed_step() as step:
        t3 = trpc.rpc_sync(peer, torch.add, (t1, t2))
        t5 = t3 * t4
        loss = t5.sum()
        out["context_id"] = step.context_id
        out["local_info"] = info_dict(rpc.describe_context())
        out["remote_info"] = info_dict(rpc.describe_remote_context(peer, step.context_id))
        out["local_info_after_remote_query"] = info_dict(rpc.describe_context())
        graph = rpc.autograd_graph(loss)
        out["graph_text"], out["graph_dot"] = graph.text(), graph.dot()
        out["graph_nodes"] = [dataclasses.asdict(node) for node in graph.nodes]
        out["graph_rpc_edges"] = [list(edge) for edge in graph.rpc_edges]
        step.backward(loss)
        gradients = step.gradients()
        out["dist_grads"] = [gradients[t].tolist() for t in (t1, t2, t4)]
    out["dot_grad_untouched"] = all(t.grad is None for t in (t1, t2, t4))
    local = [t.detach().clone().requires_grad_() for t in (t1, t2, t4)]
    (torch.add(local[0], local[1]) * local[2]).sum().backward()
    out["local_grads"] = [t.grad.tolist() for t in local]
    out["grads_bitwise_equal"] = all(torch.equal(gradients[t], l.grad) for t, l in zip((t1, t2, t4), local))

    with rpc.distributed_step() as step:
        a = trpc.rpc_sync(peer, torch.mul, (t1, 2.0))
        b = trpc.rpc_sync(peer, torch.add, (a, t2))
        c = trpc.rpc_sync(peer, torch.sin, (b,))
        out["three_local"] = info_dict(rpc.describe_context())
        out["three_all"] = {str(k): info_dict(v) for k, v in rpc.describe_all_contexts().items()}
        step.backward(c.sum())


def pipeline(session: rpc.RpcSession, out: dict) -> None:
    """master0 drives; stage0 and stage1 hold the pipeline's stages and serve."""
    if session.env.role != "master":
        return
    stages = rpc.workers("stage")
    out["lookup"] = {
        "stages": [info.name for info in stages], "stage_ids": [info.id for info in stages],
        "master": rpc.worker("master", 0).name, "roles": rpc.roles(),
    }  # fmt: skip
    attempt(out, "missing_role", lambda: rpc.workers("critic"))
    attempt(out, "train20", lambda: train_pipeline(stages, steps=20))
    attempt(out, "leak", lambda: leak_check(stages, steps=200))
    attempt(out, "remote_forward_error", lambda: remote_forward_error(stages[0].name))
    attempt(out, "remote_construction_error", lambda: remote_construction_error(stages[1].name))


def train_pipeline(stages, steps: int) -> dict:
    model = toy.make_model(seed=0)
    pipe = rpc.Pipeline(model, stages, microbatches=2)
    before = toy.max_difference(pipe.state_dict(), toy.train_locally(0))
    optimizer = rpc.distributed_optimizer(torch.optim.SGD, pipe.parameter_rrefs(), lr=toy.LR)
    losses = []
    for step in range(steps):
        x, y = toy.batch(step)
        losses.append(float(rpc.train_step(lambda: toy.loss_fn(pipe(x), y), optimizer)))
    after = pipe.state_dict()
    reference = toy.train_locally(steps)
    return {"sizes": pipe.sizes, "diff_before": before, "diff_after": toy.max_difference(after, reference),
            "moved": toy.max_difference(after, toy.train_locally(0)), "losses": losses, "repr": repr(pipe)}


def leak_check(stages, steps: int) -> dict:
    pipe = rpc.Pipeline(toy.make_model(seed=1), stages, microbatches=2)
    optimizer = rpc.distributed_optimizer(torch.optim.SGD, pipe.parameter_rrefs(), lr=toy.LR)
    names = [info.name for info in rpc.worker_infos()]
    during = {}
    for step in range(steps):
        x, y = toy.batch(step)
        with rpc.distributed_step() as dstep:
            loss = toy.loss_fn(pipe(x), y)
            dstep.backward(loss)
            dstep.step(optimizer)
            if step == 0:  # the probe sees live contexts: it can fail
                during = {name: trpc.rpc_sync(name, autograd_context_count) for name in names}
    deadline = time.monotonic() + 15.0  # releasing a context on the peers is one-way and asynchronous
    while True:
        after = {name: trpc.rpc_sync(name, autograd_context_count) for name in names}
        if not any(after.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return {"steps": steps, "during_first_step": during, "after": after}


def remote_forward_error(owner: str) -> dict:
    layer = rpc.RemoteModule(owner, FaultyLayer)
    try:
        layer(torch.ones(2, 3))
    except Exception as error:
        return {"type": type(error).__name__, "message": str(error)}
    return {"type": None, "message": "no exception"}


def remote_construction_error(owner: str) -> dict:
    try:
        rpc.RemoteModule(owner, broken_factory)
    except Exception as error:
        return {"type": type(error).__name__, "message": str(error)}
    return {"type": None, "message": "no exception"}


def blocked(session: rpc.RpcSession, out: dict) -> None:
    """Rank 0 waits in a 120 s RPC; rank 1 serves it and waits in its graceful shutdown."""
    ready = Path(OUT_DIR) / f"ready-{session.rank}"
    if session.rank == 0:
        trpc.rpc_sync("worker1", touch, (str(Path(OUT_DIR) / "served-1"),))
        touch(str(ready))
        trpc.rpc_sync("worker1", time.sleep, (120,), timeout=0)
    else:
        touch(str(ready))


SCENARIOS = {"design_note": design_note, "pipeline": pipeline, "blocked": blocked}
OUT_DIR = ""


def run_with_process_group(out: dict) -> None:
    """init_process_group and RPC on the same MASTER_PORT, then RPC started a second time."""
    dist.init_process_group("gloo")
    with rpc.start() as first:
        out["first"] = {"name": first.name, "init_method": first.init_method,
                        "echo": trpc.rpc_sync(f"worker{1 - first.rank}", torch.add, (torch.ones(1), first.rank)).item()}
        try:
            rpc.init()
        except rpc.RpcInitError as error:
            out["second_init_error"] = str(error)
    tensor = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(tensor)
    out["all_reduce"] = tensor.item()
    with rpc.start() as second:
        out["second"] = {"name": second.name, "init_method": second.init_method,
                         "echo": trpc.rpc_sync(f"worker{1 - second.rank}", torch.mul, (torch.ones(1), 3)).item()}
    out["started_after"] = rpc.is_started()
    dist.destroy_process_group()


def main() -> int:
    global OUT_DIR
    scenario, OUT_DIR = sys.argv[1], sys.argv[2]
    out: dict = {"rank": int(os.environ["RANK"]), "pid": os.getpid()}
    if scenario == "with_process_group":
        run_with_process_group(out)
    else:
        with rpc.start() as session:
            out.update(name=session.name, init_method=session.init_method)
            SCENARIOS[scenario](session, out)
    path = Path(OUT_DIR) / f"result-{out['rank']}.json"
    path.with_suffix(".tmp").write_text(json.dumps(out))
    os.replace(path.with_suffix(".tmp"), path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
