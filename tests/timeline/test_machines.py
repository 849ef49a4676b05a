"""Agents to machine lanes: a restarted agent (a new node id) stays on its machine's lane (a case table)."""

from __future__ import annotations

import pytest

from elastic.timeline.machines import Occupant, machine_lanes


def agent(host: str, first: float, free_from: float, source: str = "") -> Occupant:
    return Occupant(host, source, first, free_from)


@pytest.mark.parametrize(("agents", "lanes"), [
    # One agent per host: a lane each, in the order of their first time.
    ([agent("b", 1, 9), agent("a", 0, 9)], [1, 0]),
    # A machine that comes back: its new agent starts after the old one was gone.
    ([agent("a", 0, 9), agent("b", 0, 4), agent("b", 6, 9)], [0, 1, 1]),
    # Two agents on one host at once are two lanes; the successor takes the free one.
    ([agent("h", 0, 9), agent("h", 0, 4), agent("h", 6, 9)], [0, 1, 1]),
    # Both free: the one that wrote the same file.
    ([agent("h", 0, 3, "x"), agent("h", 0, 4, "y"), agent("h", 6, 9, "y")], [0, 1, 1]),
    ([agent("h", 0, 3, "x"), agent("h", 0, 4, "y"), agent("h", 6, 9, "x")], [0, 1, 0]),
    # Else the one free the longest.
    ([agent("h", 0, 4, "x"), agent("h", 0, 3, "y"), agent("h", 6, 9, "z")], [0, 1, 1]),
    # An agent whose first record is its predecessor's last is not its successor.
    ([agent("h", 0, 5), agent("h", 5, 9)], [0, 1]),
    # Agents of one host that never overlap share one lane, however many.
    ([agent("h", i, i + 0.5) for i in range(5)], [0] * 5),
])
def test_machine_lanes(agents, lanes):
    assert machine_lanes(agents) == lanes
