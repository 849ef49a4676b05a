"""Shared by the worker scripts: append one JSON line per event to the file the test names.

Each line carries the worker's identity as the launcher gave it (pid, ranks, sizes, restart
count, run id, master) and the wall time, so a test can order events across processes and
agents. Lines are written with one ``write`` on an ``O_APPEND`` descriptor: workers of several
agents share one file without interleaving.
"""

from __future__ import annotations

import json
import os
import time

_IDENTITY = {
    "rank": "RANK", "local_rank": "LOCAL_RANK", "world_size": "WORLD_SIZE", "group_rank": "GROUP_RANK",
    "group_world_size": "GROUP_WORLD_SIZE", "restart_count": "TORCHELASTIC_RESTART_COUNT",
}  # fmt: skip


def identity() -> dict:
    """The worker's ranks and sizes (ints), run id and master, from its environment."""
    env = os.environ
    fields = {name: int(env[var]) for name, var in _IDENTITY.items() if env.get(var, "").isdigit()}
    fields.update(pid=os.getpid(), run_id=env.get("TORCHELASTIC_RUN_ID"),
                  master=f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}")
    return fields


def report(path: str, event: str, **fields) -> None:
    """Append ``{"event": event, "time": <wall time>, **identity, **fields}`` to ``path``."""
    record = {"event": event, "time": fields.pop("time", time.time()), **identity(), **fields}
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
