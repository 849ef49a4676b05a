"""Helper processes never import from the agent's working directory.

``python -m mod`` puts the working directory first on ``sys.path``, ``python -c`` puts ``''``
(the working directory, looked up at every import). A ``datetime.py`` another user planted in a
shared working directory then ran, with the agent's rights, in our helpers: the lifeline
watchdog, the store helper, the ``--prewarm`` templates and the ``--logs-specs`` helper (stock
torchrun starts no such helper). Each now runs as ``python -c`` with :func:`isolated_program`,
whose first lines drop that entry before any import, so stdlib and installed modules come from
where they belong; a template then puts the workers' own ``sys.path[0]`` first (the script's directory),
exactly as ``python -u script.py`` would.

Why not ``-I``: it also ignores ``PYTHONPATH`` and the user site, where torch or the user's
modules may live (the store helper needs torch, the templates the user's modules). Why not
``-P``: Python 3.11 and later only, and the workers' interpreter (``$PYTHON_EXEC``) may be
older. Why not ``cwd="/"``: a relative ``PYTHONPATH`` entry would change meaning.

Our own package may be importable only through the agent's working directory (``python -m
elastic.run`` from a checkout); for the helpers that import it, the prelude appends the
directory the agent imported it from, *after* the standard library and site-packages, so it
cannot shadow them.
"""

from __future__ import annotations

import os

import elastic

__all__ = ["PACKAGE_ROOT", "isolated_program"]

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(elastic.__file__)))
"""The directory holding the ``elastic`` package this agent runs."""

_DROP_PATH0 = "import sys\nif sys.path[:1] == ['']:\n    del sys.path[0]\n"


def isolated_program(program: str, *, package_root: bool = False) -> str:
    """``program`` (source for ``python -c``) preceded by lines that remove the implicit
    working-directory entry from ``sys.path`` before any import and, with ``package_root``,
    make this package importable from :data:`PACKAGE_ROOT` (appended last, only if missing)."""
    prelude = _DROP_PATH0
    if package_root:
        prelude += f"if {PACKAGE_ROOT!r} not in sys.path:\n    sys.path.append({PACKAGE_ROOT!r})\n"
    return prelude + program
