"""Fails on its first attempt only: local rank 1 raises while ``TORCHELASTIC_RESTART_COUNT`` is 0.

    crash_once.py OUT

Every attempt reports ``started``; the failing one reports ``crash`` and raises; on a later
attempt each rank all-reduces ``rank + 1`` and reports ``allreduce`` (see ``_report``).
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

from _report import report


def main() -> int:
    out = sys.argv[1]
    report(out, "started")
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["LOCAL_RANK"] == "1":
        report(out, "crash")
        raise RuntimeError("crash_once: failing on purpose on the first attempt")
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    world = dist.get_world_size()
    tensor = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(tensor)
    report(out, "allreduce", result=int(tensor[0]), expected=world * (world + 1) // 2)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
