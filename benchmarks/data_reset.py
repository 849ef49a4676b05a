"""What a new world costs an ElasticLoader with worker processes: the reset of its DataLoader.

Run:  python benchmarks/data_reset.py [--repetitions 20] [--sample-ms 0,2] [--workers 2]

A map-style dataset whose samples each take ``--sample-ms`` to load (a sleep in the worker);
micro-batches of 32, accumulation 2, ``prefetch_factor`` 2, ``--workers`` worker processes,
persistent and not. Each repetition takes steps in world 4 and measures:

* **steady**: a step in the same world after ``--compute-ms`` (the training's compute, during
  which the workers load ahead): what a step's data costs normally;
* **idle**: the world changed after ``--compute-ms``, the workers done loading ahead: the
  reset alone (``reset``: the workers acknowledge it; with non-persistent workers, new
  processes are started and the old ones stopped) and the whole next step (``step``: the
  reset, then the step's micro-batches loaded with nothing ahead);
* **busy**: the world changed right after a step was taken, the workers still loading ahead:
  the reset waits for the micro-batches in flight (up to ``prefetch_factor`` per worker).

Prints the median and the maximum of each, in milliseconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import torch  # noqa: E402
import torch.utils.data as tud  # noqa: E402

from elastic.worker.data import ElasticLoader  # noqa: E402


class Slow(tud.Dataset):
    def __init__(self, length: int, seconds: float) -> None:
        self.length, self.seconds = length, seconds

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.seconds:
            time.sleep(self.seconds)
        return torch.full((64,), float(index))


def measure(args: argparse.Namespace, sample_ms: float, persistent: bool) -> dict[str, list[float]]:
    loader = ElasticLoader(Slow(100_000, sample_ms / 1000), 32, accumulation=2, num_workers=args.workers,
                           persistent_workers=persistent, prefetch_factor=2, multiprocessing_context="fork")
    figures: dict[str, list[float]] = {name: [] for name in
                                       ("steady", "idle reset", "idle step", "busy reset", "busy step")}
    case = ["steady"]
    restart = loader._restart

    def timed_restart(*args: int) -> None:
        began = time.perf_counter()
        restart(*args)
        figures.setdefault(f"{case[0]} reset", []).append(time.perf_counter() - began)

    def step(name: str, world: int, pause: float) -> None:
        time.sleep(pause)
        case[0] = name
        loader.set_world(0, world)
        began = time.perf_counter()
        loader.next_step()
        figures.setdefault(name if name == "steady" else f"{name} step", []).append(time.perf_counter() - began)
        loader.commit()

    loader._restart = timed_restart
    compute = args.compute_ms / 1000
    try:
        step("warm-up", 4, 0)
        for _ in range(args.repetitions):
            step("steady", 4, compute)
            step("idle", 2, compute)
            step("steady", 2, compute)
            step("busy", 4, 0)
    finally:
        loader.close()
    return {name: values for name, values in figures.items() if values and not name.startswith("warm-up")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repetitions", type=int, default=20)
    parser.add_argument("--sample-ms", default="0,2", help="load time of one sample, comma-separated cases")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--compute-ms", type=float, default=300.0, help="time between steps")
    args = parser.parse_args(argv)
    print(f"{args.workers} workers, micro-batch 32, accumulation 2, prefetch_factor 2, "
          f"{args.repetitions} repetitions, load average {os.getloadavg()[0]:.1f}")
    for sample_ms in (float(value) for value in args.sample_ms.split(",")):
        for persistent in (True, False):
            figures = measure(args, sample_ms, persistent)
            cells = ", ".join(f"{name} {statistics.median(values) * 1000:.1f} (max {max(values) * 1000:.1f})"
                              for name, values in figures.items())
            print(f"sample {sample_ms:g} ms, {'persistent' if persistent else 'new workers'}: {cells} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
