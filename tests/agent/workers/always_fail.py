"""Always fails, through torch's ``@record``, which writes ``TORCHELASTIC_ERROR_FILE``.

    always_fail.py OUT

Reports ``started`` and raises ``ValueError("always_fail: rank N gives up")`` from a
recognisable function name, so the test can find it in the agent's traceback summary.
"""

from __future__ import annotations

import os
import sys

from _report import report

report(sys.argv[1], "started")  # before torch is imported: a stopped attempt still counts

from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402


def deliberately_failing_step() -> None:
    raise ValueError(f"always_fail: rank {os.environ['RANK']} gives up")


@record
def main() -> None:
    deliberately_failing_step()


if __name__ == "__main__":
    main()
