"""The live-recovery verdict on chaos records (``live_records``): pure functions, case tables."""

from __future__ import annotations

import json

import pytest

from live_records import checksum_problems, live_problems, read_rows, redo_problems


def step(node: str, number: int, t: float, pid: int = 1, equal: bool = True, total: float = 1.0) -> dict:
    return {"event": "step", "node": node, "step": number, "time": t, "pid": pid, "attempt": "round-1",
            "equal": equal, "sum": total}


def formed(node: str, t: float, start: int, role: str, pid: int = 1) -> dict:
    return {"event": "formed", "node": node, "time": t, "start": start, "role": role, "pid": pid, "attempt": "round-2"}


def steady(node: str, first: int, last: int, t0: float = 0.0, pid: int = 1) -> list[dict]:
    return [step(node, number, t0 + number, pid) for number in range(first, last + 1)]


REDO_CASES = [
    # (name, rows of one node in time order, problems expected)
    ("consecutive from 1", steady("a", 1, 5), 0),
    ("a sender re-forms in place", steady("a", 1, 3) + [formed("a", 3.5, 3, "source")] + steady("a", 4, 6), 0),
    ("a step committed twice", steady("a", 1, 3) + [step("a", 3, 3.5)] + steady("a", 4, 5, t0=0.6), 1),
    ("a step skipped without a heal", steady("a", 1, 3) + steady("a", 5, 6), 1),
    ("healed forward by a receiver", steady("b", 1, 3) + [formed("b", 8.5, 8, "receiver", pid=2)]
     + steady("b", 9, 10, pid=2), 0),
    ("healed, then stepped past the healed step", steady("b", 1, 3) + [formed("b", 8.5, 8, "receiver")]
     + [step("b", 10, 10.5)], 1),
    ("the first step is not 1 without a heal", steady("a", 2, 4), 1),
    ("a fresh worker healed at the start", [formed("b", 0.5, 0, "receiver")] + steady("b", 1, 2), 0),
]


@pytest.mark.parametrize(("rows", "expected"), [case[1:] for case in REDO_CASES], ids=[case[0] for case in REDO_CASES])
def test_a_node_commits_each_step_once_in_order_or_where_a_heal_took_it(rows, expected):
    assert len(redo_problems(rows)) == expected


CHECKSUM_CASES = [
    ("equal everywhere", [step("a", 1, 1), step("b", 1, 1.1)], 0),
    ("ranks differed at a step's start", [step("a", 1, 1, equal=False)], 1),
    ("no check logged", [{**step("a", 1, 1), "equal": None}], 1),
    ("two nodes ended a step apart", [step("a", 1, 1, total=1.0), step("b", 1, 1.1, total=1.5)], 1),
]


@pytest.mark.parametrize(("rows", "expected"), [case[1:] for case in CHECKSUM_CASES],
                         ids=[case[0] for case in CHECKSUM_CASES])
def test_every_rank_has_the_same_parameters_at_every_step(rows, expected):
    assert len(checksum_problems(rows)) == expected


def test_a_step_nobody_committed_is_a_problem():
    rows = steady("a", 1, 3) + [formed("b", 5.5, 5, "receiver", pid=2)] + steady("b", 6, 7, pid=2)
    assert live_problems(sorted(steady("a", 1, 3) + steady("b", 1, 3) + steady("a", 4, 7), key=lambda r: r["time"]),
                         7) == []
    problems = live_problems(rows, 7)
    assert len(problems) == 1 and "[4, 5]" in problems[0], problems


def test_rows_are_read_in_time_order_and_a_torn_line_is_skipped(tmp_path):
    (tmp_path / "attempt-0002.jsonl").write_text(json.dumps(step("a", 2, 2.0)) + "\n")
    (tmp_path / "attempt-0001.jsonl").write_text(json.dumps(step("a", 1, 1.0)) + "\n" + '{"event": "st')
    assert [row["step"] for row in read_rows(tmp_path)] == [1, 2]
