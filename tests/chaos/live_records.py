"""The live-recovery verdict on a chaos job's records (``workers/live_train.py`` runs). Pure but
for :func:`read_rows`.

:func:`chaoslib.figures` judges what every launcher must do (exit codes, last step, attempts
and world sizes); a job under ``elasticrun --live-recovery`` must in addition keep its state
across every round: :func:`live_problems` says where it did not.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Iterable


def read_rows(out_dir: Path) -> list[dict]:
    """Every record line as written (with the live worker's extra fields), in time order; a torn
    last line (a worker killed mid-write) is skipped."""
    rows = []
    for path in sorted(out_dir.glob("attempt-*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return sorted(rows, key=lambda row: row["time"])


def redo_problems(rows: Iterable[dict]) -> list[str]:
    """Per node, each committed step follows the one before, or the step a heal brought the node
    to (a worker left behind receives the state and goes on from there): no step committed twice,
    none skipped without a heal."""
    problems = []
    by_node: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        if row["event"] in ("step", "formed"):
            by_node[row["node"]].append(row)
    for node, events in sorted(by_node.items()):
        previous: int | None = None
        healed_to: int | None = None
        for row in events:
            if row["event"] == "formed":
                if row.get("role") == "receiver":
                    healed_to = row["start"]
                continue
            step = row["step"]
            allowed = {previous + 1} if previous is not None else {1}
            if healed_to is not None:
                allowed.add(healed_to + 1)
            if step not in allowed:
                what = "committed again" if previous is not None and step <= previous else "out of order"
                problems.append(f"node {node} committed step {step} after step {previous} ({what}; "
                                f"pid {row['pid']}, {row['attempt']})")
            previous, healed_to = step, None
    return problems


def checksum_problems(rows: Iterable[dict]) -> list[str]:
    """Every rank had the same parameters at the start of every step (the all-reduced checksum),
    and every worker that committed a step ended it with the same parameter sum."""
    problems = []
    sums: dict[int, tuple[str, float]] = {}
    for row in rows:
        if row["event"] != "step":
            continue
        if row.get("equal") is not True:
            problems.append(f"node {row['node']} step {row['step']} ({row['attempt']}): the ranks had different "
                            "parameters at its start")
        node, value = sums.setdefault(row["step"], (row["node"], row["sum"]))
        if value != row["sum"]:
            problems.append(f"step {row['step']}: node {row['node']} ended it with parameter sum {row['sum']!r}, "
                            f"node {node} with {value!r}")
    return problems


def live_problems(rows: list[dict], steps: int) -> list[str]:
    """Everything a live-recovery run got wrong beyond :func:`test_chaos.judge`'s common verdict:
    redone or skipped steps, unequal parameters, a step of ``1..steps`` that nobody committed."""
    problems = redo_problems(rows) + checksum_problems(rows)
    committed = {row["step"] for row in rows if row["event"] == "step"}
    missing = sorted(set(range(1, steps + 1)) - committed)
    if missing:
        problems.append(f"no worker committed steps {missing[:10]}{' ...' if len(missing) > 10 else ''}")
    return problems
