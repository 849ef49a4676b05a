"""A worker that does nothing but note when it started: one JSON line appended to OUT.

    noop.py OUT [--import MODULE]

No torch import: what is timed around it is the launcher, not the worker's own imports. With
``--import torch`` it also notes ``ready``: when that import finished (instant in a worker
forked from a ``--prewarm`` template that already imported it).
"""

import time

STARTED = time.time()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

record = {"pid": os.getpid(), "rank": os.environ.get("RANK"), "started": STARTED}
if sys.argv[2:3] == ["--import"]:
    __import__(sys.argv[3])
    record["ready"] = time.time()
line = json.dumps(record) + "\n"
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, line.encode())
os.close(fd)
