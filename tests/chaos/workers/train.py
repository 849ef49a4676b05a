"""The chaos suite's training worker: gloo on CPU, N steps of S seconds, one all_reduce per step.

    train.py OUT_DIR --steps N --step-seconds S [--chatter]

Every rank appends one JSON line per event to ``OUT_DIR/attempt-r<restart>-p<master port>.jsonl``
(the master port is fresh for every attempt, so one file is one attempt):

* ``formed`` once the process group is up (``start``: the step it resumes from);
* ``step`` after each step's all_reduce (``step`` counts from 1; the sum is checked to equal
  the world size, else the worker exits 3);
* ``done`` after the last step.

Each line carries ``attempt``, ``restart`` (TORCHELASTIC_RESTART_COUNT), ``rank``, ``world``,
``node`` (``$CHAOS_NODE``), ``pid`` and ``time`` (wall clock, comparable with the test's own
fault times on the same machine). Lines are written with one ``write`` on an ``O_APPEND`` file,
so ranks never interleave.

``--chatter``: after each step, also print ``chatter step <step> rank <rank> ....`` (1 KiB) to
stdout and the same line ending `` (stderr)`` to stderr: output for the launcher to log.

Resume: after each step rank 0 replaces ``OUT_DIR/checkpoint.json`` with the number of steps
finished; a new attempt starts after the largest count any rank read (all_reduce MAX), so a step
is *finished* once its checkpoint is written, and the job is done when step N is.
"""

from __future__ import annotations

import time

STARTED = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-seconds", type=float, default=0.25)
    parser.add_argument("--collective-timeout", type=float, default=60.0)
    parser.add_argument("--chatter", action="store_true", help="print a line per step to stdout and stderr")
    return parser.parse_args()


class Recorder:
    """Appends this rank's lines to the attempt's file."""

    def __init__(self, out_dir: Path, **fields: object) -> None:
        self.fields = fields
        name = f"attempt-r{fields['restart']}-p{os.environ.get('MASTER_PORT', 'none')}.jsonl"
        self.fd = os.open(out_dir / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, event: str, **values: object) -> None:
        line = json.dumps({"event": event, **self.fields, **values, "time": time.time()}) + "\n"
        os.write(self.fd, line.encode())


def read_checkpoint(path: Path) -> int:
    try:
        return int(json.loads(path.read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def write_checkpoint(path: Path, step: int) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(json.dumps({"step": step}))
    os.replace(temporary, path)


def main() -> int:
    args = parse_args()
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=args.collective_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    attempt = f"r{restart}-{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    recorder = Recorder(args.out_dir, attempt=attempt, restart=restart, rank=rank, world=world,
                        node=os.environ.get("CHAOS_NODE", "?"), pid=os.getpid())
    checkpoint = args.out_dir / "checkpoint.json"
    start = torch.tensor([float(read_checkpoint(checkpoint))])
    dist.all_reduce(start, op=dist.ReduceOp.MAX)
    first = int(start.item())
    recorder.write("formed", start=first, worker_started=STARTED)
    for step in range(first + 1, args.steps + 1):
        time.sleep(args.step_seconds)
        ones = torch.ones(1)
        dist.all_reduce(ones)
        if int(ones.item()) != world:
            recorder.write("bad_sum", step=step, sum=float(ones.item()))
            return 3
        if rank == 0:
            write_checkpoint(checkpoint, step)
        recorder.write("step", step=step)
        if args.chatter:
            line = f"chatter step {step} rank {rank} ".ljust(1023, ".")
            print(line, flush=True)
            print(f"{line} (stderr)", file=sys.stderr, flush=True)
    recorder.write("done", step=args.steps)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
