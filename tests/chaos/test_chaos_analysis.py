"""The chaos harness's reading of worker records: pure functions, case tables, no processes."""

from __future__ import annotations

import json

import pytest

from chaoslib import (Record, figures, last_step, longest_gap, overlaps, parse_records, reform_seconds, spans,
                      steps_redone)


def rec(attempt: str, rank: int, t: float, event: str = "step", step: int | None = None, world: int = 2,
        node: str | None = None, pid: int | None = None, restart: int = 0) -> Record:
    return Record(event, attempt, restart, rank, world, node or f"n{rank}", pid or (1000 + rank), t, step)


def job(attempt: str, ranks: tuple[int, ...], times: list[float], first_step: int = 1, world: int = 2,
        pids: dict[int, int] | None = None, nodes: dict[int, str] | None = None) -> list[Record]:
    """A formed record at times[0] then one step per later time, for every rank."""
    rows = []
    for rank in ranks:
        node, pid = (nodes or {}).get(rank), (pids or {}).get(rank)
        rows.append(rec(attempt, rank, times[0], "formed", world=world, node=node, pid=pid))
        for index, t in enumerate(times[1:]):
            rows.append(rec(attempt, rank, t + 0.001 * rank, step=first_step + index, world=world, node=node, pid=pid))
    return rows


OVERLAP_CASES = [
    # (name, records, expected number of problems)
    ("one attempt", job("A", (0, 1), [0, 1, 2, 3]), 0),
    ("back to back", job("A", (0, 1), [0, 1, 2]) + job("B", (0, 1), [3, 4, 5], pids={0: 7, 1: 8}), 0),
    ("split brain on rank 0", job("A", (0, 1), [0, 1, 2, 5]) + job("B", (0,), [2.5, 3, 4], world=1), 1),
    ("at once but disjoint ranks", job("A", (0,), [0, 1, 5], world=1) + job("B", (1,), [2, 3, 4], world=1), 0),
    ("formed but never stepped", job("A", (0, 1), [0, 1, 5]) + [rec("B", 0, 3, "formed")], 0),
]


@pytest.mark.parametrize(("records", "expected"), [case[1:] for case in OVERLAP_CASES],
                         ids=[case[0] for case in OVERLAP_CASES])
def test_overlaps_are_attempts_training_the_same_rank_at_once(records, expected):
    assert len(overlaps(spans(sorted(records, key=lambda r: r.time)))) == expected


GAP_CASES = [
    ("no steps", [], 0.0),
    ("one step", [rec("A", 0, 1.0, step=1)], 0.0),
    ("steady", job("A", (0, 1), [0, 1, 2, 3]), pytest.approx(1.0, abs=0.01)),
    ("a stall", job("A", (0, 1), [0, 1, 2, 9, 10]), pytest.approx(7.0, abs=0.01)),
    ("formed rows are not steps", [rec("A", 0, 0, "formed"), rec("A", 0, 5, step=1), rec("A", 0, 6, step=2)],
     pytest.approx(1.0)),
]


@pytest.mark.parametrize(("records", "expected"), [case[1:] for case in GAP_CASES], ids=[case[0] for case in GAP_CASES])
def test_longest_gap_is_the_longest_time_without_a_finished_step(records, expected):
    assert longest_gap(records) == expected


def test_reform_is_the_first_step_of_an_attempt_formed_after_the_fault():
    records = job("A", (0, 1), [0, 1, 2]) + job("B", (0, 1), [4, 6, 7], first_step=3, pids={0: 7, 1: 8})
    found = spans(sorted(records, key=lambda r: r.time))
    assert reform_seconds(found, since=2.5) == pytest.approx(3.5)
    assert reform_seconds(found, since=6.5) is None
    assert [span.steps for span in found] == [(1, 2), (3, 4)]


REDONE_CASES = [
    ("one attempt", job("A", (0, 1), [0, 1, 2, 3]), 0),
    ("resumed after its last step", job("A", (0, 1), [0, 1, 2]) + job("B", (0, 1), [3, 4, 5], first_step=3), 0),
    ("one step trained twice", job("A", (0, 1), [0, 1, 2, 3]) + job("B", (0, 1), [4, 5, 6], first_step=3), 1),
    ("torn down before a step", job("A", (0, 1), [0, 1, 2]) + [rec("B", 0, 3, "formed")], 0),
    ("three attempts", job("A", (0,), [0, 1, 2, 3, 4], world=1) + job("B", (0,), [5, 6, 7], first_step=2, world=1)
     + job("C", (0,), [8, 9, 10], first_step=3, world=1), 4),
    ("one attempt written under two ids", job("A", (0, 1), [0, 1, 2]) + job("B", (0,), [3, 4, 5], first_step=3)
     + job("C", (1,), [3, 4, 5], first_step=3), 0),
]


@pytest.mark.parametrize(("records", "expected"), [case[1:] for case in REDONE_CASES],
                         ids=[case[0] for case in REDONE_CASES])
def test_steps_redone_are_steps_more_than_one_attempt_trained(records, expected):
    assert steps_redone(records) == expected


def test_figures_count_restarts_per_node_charged_restarts_and_empty_attempts():
    records = (job("A", (0, 1), [0, 1, 2], nodes={0: "a", 1: "b"})
               + [rec("B", 0, 2.5, "formed", node="a", pid=50)]
               + job("C", (0, 1), [3, 4, 5], first_step=3, nodes={0: "a", 1: "b"}, pids={0: 60, 1: 61}))
    records += [rec("C", 1, 5.5, "done", step=100, node="b", pid=61, restart=1)]
    found = figures(sorted(records, key=lambda r: r.time), fault_at=2.2)
    assert found.worlds == (2, 2)
    assert found.empty_attempts == 1
    assert found.restarts == {"a": 2, "b": 1}
    assert found.charged == 1
    assert found.last_step == 100
    assert found.reform == pytest.approx(1.8, abs=0.01)  # C formed at 3, first step at 4
    assert found.redone == 0
    assert "worlds 2->2" in found.line() and "re-form 1.8 s" in found.line() and "steps redone 0" in found.line()


def test_a_torn_last_line_is_skipped():
    good = {"event": "step", "attempt": "A", "restart": 0, "rank": 0, "world": 2, "node": "a", "pid": 1,
            "time": 1.0, "step": 7}
    records = parse_records([json.dumps(good), '{"event": "st'])
    assert [record.step for record in records] == [7]
    assert last_step(records) == 7
