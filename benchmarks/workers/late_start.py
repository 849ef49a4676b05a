"""How long a benchmark worker sleeps before its training starts: a restarted worker that takes
that long to be ready (a GPU's initialisation, a model's construction), for the side-by-side
benchmark's ``slow_replacement`` fault.

``LIVE_RESTART_SLEEP`` (seconds, default 0) applies to every worker that is not its node's first:
the node's log ($LIVE_LOG) already holds a ``start`` event. That is the replacement of a crashed
worker and, for a launcher that restarts the whole group (torchrun), the survivor's restarted
worker too. Pure, so the rule is tested without a launcher
(``tests/benchmarks/test_late_start.py``).
"""

from __future__ import annotations

import json
from typing import Mapping

RESTART_SLEEP_VAR = "LIVE_RESTART_SLEEP"


def restart_sleep(log_text: str, environ: Mapping[str, str]) -> float:
    """Seconds to sleep before training: ``LIVE_RESTART_SLEEP`` when ``log_text`` (the node's log
    before this worker's own ``start``) has a ``start`` event, else 0.

    Raises:
        ValueError: ``LIVE_RESTART_SLEEP`` is not a number, or negative.
    """
    seconds = float(environ.get(RESTART_SLEEP_VAR, "0") or "0")
    if seconds < 0:
        raise ValueError(f"{RESTART_SLEEP_VAR} ({seconds:g}) must not be negative.")
    if not seconds:
        return 0.0
    for line in log_text.split("\n"):
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line a killed worker left half written, or an empty one
        if isinstance(event, dict) and event.get("ev") == "start":
            return seconds
    return 0.0


def read_log(path: str) -> str:
    """The node's log as it is now; empty when there is none yet."""
    try:
        with open(path) as log:
            return log.read()
    except FileNotFoundError:
        return ""
