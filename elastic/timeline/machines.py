"""Which agents ran on the same machine, one after the other: a lane per machine, not per agent.

A restarted agent gets a new node id, so node ids do not say that a machine came back; its host
name (``host`` in every record) does. `machine_lanes` puts each agent on a lane of its host: the
lane of an earlier agent of that host that was gone (its last record, or its end) before this one's
first record, preferring one that wrote the same file, else the one free the longest; a new lane
when every lane of the host is busy (several agents on one host at once, as in tests). Agents of
one host that never overlap share one lane; the lanes are ordered by their first agent.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Occupant", "machine_lanes"]


@dataclass(frozen=True)
class Occupant:
    """An agent as the lanes see it: its host, the file it was read from, and the time it took
    its lane (``first``) and was gone (``free_from``)."""

    host: str
    source: str
    first: float
    free_from: float


def machine_lanes(agents: Sequence[Occupant]) -> list[int]:
    """The lane of each of ``agents`` (in the order given), numbered by first use. O(n log n)."""
    lane_of = [0] * len(agents)
    free: dict[str, list[tuple[float, int]]] = {}  # per host: (free from, lane), a heap
    by_source: dict[tuple[str, str], int] = {}  # the lane last used by (host, file)
    free_from: list[float] = []  # per lane: when its last agent was gone
    for index in sorted(range(len(agents)), key=lambda i: agents[i].first):
        agent = agents[index]
        heap = free.setdefault(agent.host, [])
        lane = by_source.get((agent.host, agent.source))
        if lane is None or free_from[lane] >= agent.first:
            lane = _oldest_free(heap, agent.first, free_from)
        if lane is None:
            lane = len(free_from)
            free_from.append(agent.free_from)
        lane_of[index] = lane
        by_source[(agent.host, agent.source)] = lane
        free_from[lane] = agent.free_from
        heapq.heappush(heap, (agent.free_from, lane))
    return lane_of  # numbered in the order of first use: the agents were taken by first time


def _oldest_free(heap: list[tuple[float, int]], at: float, free_from: list[float]) -> int | None:
    """The lane of the heap free the longest before ``at``, taken off the heap (stale entries,
    of lanes taken again since, are dropped)."""
    while heap:
        since, lane = heap[0]
        if since != free_from[lane]:
            heapq.heappop(heap)
            continue
        if since >= at:
            return None
        heapq.heappop(heap)
        return lane
    return None
