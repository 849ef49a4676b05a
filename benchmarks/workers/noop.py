"""A worker that does nothing but note when it started: one JSON line appended to OUT.

    noop.py OUT

No torch import: what is timed around it is the launcher, not the worker's own imports.
"""

import time

STARTED = time.time()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

line = json.dumps({"pid": os.getpid(), "rank": os.environ.get("RANK"), "started": STARTED}) + "\n"
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, line.encode())
os.close(fd)
