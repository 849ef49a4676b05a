"""Whether the training script is there, judged before any worker starts.

A mistyped path (``examples/train_dpp.py``) used to start every worker, each of which printed
Python's ``can't open file``, then a root-cause report: one mistake, a screenful. The CLI now
looks for the file first and refuses it in one line (status 2, a bad command line), with the
closest name in that directory when one is close. Only a script (``python -u SCRIPT``) and
``--run-path FILE`` name a file: ``-m MODULE`` is found on ``sys.path`` by the worker's Python,
and ``--no-python COMMAND`` on ``PATH``, so neither is judged here.

The path is taken as the workers take it: relative to the launcher's working directory, which
they inherit.
"""

from __future__ import annotations

import difflib
import os

from elastic.config import Entrypoint

__all__ = ["script_problem"]

FILE_KINDS = ("script", "run_path")
"""The entrypoint kinds whose target is a file path."""

MAX_NAMES_COMPARED = 10_000
"""A directory with more entries gets no did-you-mean (comparing them all would be slow)."""


def script_problem(entrypoint: Entrypoint, cwd: str) -> str | None:
    """Why the workers could not open ``entrypoint``'s script from ``cwd``, as one line, or None.

    ``the training script examples/train_dpp.py does not exist (in /work); did you mean
    examples/train_ddp.py?``. The hint names the closest entry of the script's directory, when
    that directory exists and one is close enough.
    """
    if entrypoint.kind not in FILE_KINDS:
        return None
    target = entrypoint.target
    path = os.path.join(cwd, target)
    if os.path.exists(path):
        return None
    where = "" if os.path.isabs(target) else f" (in {cwd})"
    return f"the training script {target} does not exist{where}{_did_you_mean(target, cwd)}"


def _did_you_mean(target: str, cwd: str) -> str:
    """``; did you mean DIR/NAME?`` for the closest name in the target's directory, or ``""``."""
    directory, name = os.path.split(target)
    parent = os.path.join(cwd, directory)
    if not os.path.isdir(parent):
        return f"; there is no directory {directory}"
    try:
        names = os.listdir(parent)
    except OSError:
        return ""
    if len(names) > MAX_NAMES_COMPARED:
        return ""
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    return f"; did you mean {os.path.join(directory, close[0])}?" if close else ""
