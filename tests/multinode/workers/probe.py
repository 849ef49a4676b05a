"""The multi-node harness's worker: one JSON row per worker per attempt, with its whole world.

    probe.py TABLE [--steps N] [--step-sleep S] [--stop-file F] [--crash-node NODE]
                   [--crash-at-step K] [--crash-once-file F] [--pg-timeout S] [--max-seconds S]
                   [--checkpoint-dir D]

Appends to ``TABLE`` (one ``write`` per row on an ``O_APPEND`` descriptor, so every worker of
every agent shares one file):

- ``started``: before torch is imported, with the environment the launcher gave (the launcher
  variables listed in ``ENV_KEYS`` and every ``ELASTIC_*``/``PROBE_*`` one) and the pid;
- ``formed``: after ``init_process_group("gloo")``, an all-reduce (sum) of the rank and an
  ``all_gather_object`` of a token unique to this process: the tokens name exactly the workers
  that really formed one process group, whatever the launcher claimed;
- ``finished`` after the training loop, or ``failed`` (with the error) when the process group or
  a collective failed, or ``timeout`` when ``--max-seconds`` ran out: every wait is bounded, a
  hang becomes a row and a non-zero exit.

Training: ``--steps N`` all-reduces N times (``--step-sleep`` apart). With ``--stop-file`` it
runs until that file exists instead (checked collectively: every rank stops at the same step).
``--crash-node NODE --crash-at-step K`` makes the worker with ``PROBE_NODE == NODE`` and
``LOCAL_RANK == 0`` SIGKILL itself at step K, once per ``--crash-once-file`` (created with
``O_EXCL``, so exactly one crash happens whatever restart counts the launchers give).
``--checkpoint-dir D`` keeps each worker's step count in ``D/<PROBE_NODE>-<LOCAL_RANK>`` (a
machine's own disk: nothing shared between nodes) and resumes ``--steps`` from it, as a training
script with node-local checkpoints does; ``finished`` then carries ``resumed_from``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import uuid

ENV_KEYS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ATTEMPT", "TORCHELASTIC_ERROR_FILE",
)  # fmt: skip
ENV_PREFIXES = ("ELASTIC_", "PROBE_")


def environment() -> dict[str, str]:
    env = os.environ
    return {key: value for key, value in env.items() if key in ENV_KEYS or key.startswith(ENV_PREFIXES)}


class Table:
    """Appends rows ``{"event", "time", "pid", "token", "node", "env", **fields}`` to one file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.token = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.env = environment()
        self._lock = threading.Lock()

    def row(self, event: str, **fields) -> None:
        record = {"event": event, "time": time.time(), "pid": os.getpid(), "token": self.token,
                  "node": self.env.get("PROBE_NODE"), "env": self.env, **fields}
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("table")
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--step-sleep", type=float, default=0.05)
    parser.add_argument("--stop-file", default="")
    parser.add_argument("--crash-node", default="")
    parser.add_argument("--crash-at-step", type=int, default=0)
    parser.add_argument("--crash-once-file", default="")
    parser.add_argument("--pg-timeout", type=float, default=20.0)
    parser.add_argument("--max-seconds", type=float, default=90.0)
    parser.add_argument("--checkpoint-dir", default="")
    return parser.parse_args(argv)


def watchdog(table: Table, seconds: float) -> None:
    """After ``seconds``, write a ``timeout`` row and exit 3, whatever the main thread is stuck in."""
    def expire() -> None:
        time.sleep(seconds)
        table.row("timeout", seconds=seconds)
        os._exit(3)
    threading.Thread(target=expire, daemon=True).start()


def should_crash(args: argparse.Namespace, table: Table, step: int) -> bool:
    if not args.crash_node or step != args.crash_at_step:
        return False
    if table.env.get("PROBE_NODE") != args.crash_node or os.environ.get("LOCAL_RANK") != "0":
        return False
    try:
        os.close(os.open(args.crash_once_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    return True


class Checkpoint:
    """This worker's step count on its node's own disk (``--checkpoint-dir``; nothing without it)."""

    def __init__(self, directory: str, table: Table) -> None:
        name = f"{table.env.get('PROBE_NODE')}-{os.environ.get('LOCAL_RANK', '0')}"
        self.path = os.path.join(directory, name) if directory else ""

    def load(self) -> int:
        if not self.path or not os.path.exists(self.path):
            return 0
        with open(self.path) as saved:
            return int(saved.read() or 0)

    def save(self, step: int) -> None:
        if self.path:
            with open(f"{self.path}.tmp", "w") as out:
                out.write(str(step))
            os.replace(f"{self.path}.tmp", self.path)


def train(args: argparse.Namespace, table: Table, dist, torch, checkpoint: Checkpoint, start: int = 0) -> int:
    """All-reduce ``[1, stop]`` each step from step ``start``; returns the steps done."""
    step = start
    while True:
        if args.steps and not args.stop_file and step >= args.steps:
            return step
        stop = 1.0 if args.stop_file and os.path.exists(args.stop_file) else 0.0
        tensor = torch.tensor([1.0, stop])
        dist.all_reduce(tensor)
        step += 1
        checkpoint.save(step)
        if tensor[1].item() > 0:
            return step
        if should_crash(args, table, step):
            table.row("crash", step=step)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(args.step_sleep)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    table = Table(args.table)
    table.row("started")
    watchdog(table, args.max_seconds)
    try:
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        imported = time.time()
        dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
        rank, world = dist.get_rank(), dist.get_world_size()
        summed = torch.tensor([float(rank)])
        dist.all_reduce(summed)
        tokens: list = [None] * world
        dist.all_gather_object(tokens, table.token)
        table.row("formed", rank=rank, world=world, allreduce_sum=int(summed.item()), tokens=tokens,
                  imported=imported)
        checkpoint = Checkpoint(args.checkpoint_dir, table)
        start = checkpoint.load()
        steps = train(args, table, dist, torch, checkpoint, start)
        table.row("finished", steps=steps, resumed_from=start)
        dist.destroy_process_group()
    except Exception as error:  # a failed group or collective: one row, a non-zero exit
        table.row("failed", error=f"{type(error).__name__}: {error}"[:500])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
