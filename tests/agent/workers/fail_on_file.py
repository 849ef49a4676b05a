"""Waits for a trigger file, then fails once; a later attempt finishes at once. No torch.

    fail_on_file.py OUT TRIGGER

Every attempt reports ``started``. While ``TRIGGER`` does not exist it waits (at most 60 s).
The first attempt to see it creates ``TRIGGER.done``, reports ``crash`` and exits 1; an attempt
that finds ``TRIGGER.done`` reports ``finished`` and exits 0.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from _report import report


def main() -> int:
    out, trigger = sys.argv[1], Path(sys.argv[2])
    done = trigger.with_name(trigger.name + ".done")
    report(out, "started")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if done.exists():
            report(out, "finished")
            return 0
        if trigger.exists():
            done.touch()
            report(out, "crash")
            return 1
        time.sleep(0.05)
    return 2


if __name__ == "__main__":
    sys.exit(main())
