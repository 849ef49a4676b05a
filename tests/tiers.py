"""The test tiers and which of them a command line runs (pure; the hooks are in ``conftest.py``).

A test's tiers are its tier markers (``slow``, ``etcd``, ``chaos``); a test with none is in the
``fast`` tier. ``python -m pytest`` alone runs the fast tier; ``--tier NAME`` (repeatable) runs
the union of the named tiers, ``--all`` every test (what CI runs). Naming paths, or selecting
with ``-m`` or ``-k``, runs what was selected, in every tier, as plain pytest would.
"""

from __future__ import annotations

FAST = "fast"
MARKERS = ("slow", "etcd", "chaos")
TIERS = (FAST, *MARKERS)


def tiers_of(marker_names: set[str]) -> frozenset[str]:
    """The tiers of a test with these markers."""
    return frozenset(MARKERS).intersection(marker_names) or frozenset({FAST})


def selected_tiers(*, tiers: list[str], run_all: bool, markexpr: str, keyword: str,
                   paths_given: bool) -> frozenset[str] | None:
    """The tiers to run; None: no tier filter (every test the rest of the command line selects).

    Raises ValueError when ``--all`` and ``--tier`` are both given.
    """
    if run_all and tiers:
        raise ValueError(f"--all runs every tier; it cannot be combined with --tier {' '.join(tiers)}.")
    if run_all:
        return None
    if tiers:
        return frozenset(tiers)
    if markexpr or keyword or paths_given:
        return None
    return frozenset({FAST})
