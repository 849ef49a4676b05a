"""A live worker that ends its run normally, then prints the names of its process's threads.

Automatic garbage collection is off: that every group the library formed ends with the run must
not depend on when a collection happens to run. The optimizer is built after the start, so no
import of the program's brings in ``torch.distributed.nn`` before the first group forms
(torch's optimizers do, through ``torch._dynamo``).
"""

import gc
import os

gc.disable()

import torch  # noqa: E402

from elastic.worker import LiveTraining  # noqa: E402


def say(line: str) -> None:
    os.write(1, f"{line}\n".encode())  # one write: the ranks share the agent's stdout


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    with LiveTraining(state={"model": model}) as live:
        ddp = live.ddp(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(attempt):
            opt.zero_grad()
            ddp(torch.randn(8, 4)).pow(2).mean().backward()
            live.all_reduce(torch.ones(1))
            opt.step()

        for _ in live.run(step, until=3):
            pass
        say(f"rank {live.rank} done: step {live.step}")


main()
threads = sorted(open(f"/proc/self/task/{task}/comm").read().strip() for task in os.listdir("/proc/self/task"))
say(f"threads after main: {' '.join(threads)}")
