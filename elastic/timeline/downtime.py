"""The time a job did not train, fault by fault: a pure function of the rounds' spans.

**Downtime** is the time between two spans in which the job trained (`rounds.RoundSpan`): an
interruption begins where a round stopped (its first sign: a worker's failure, a node's death as
its peers first saw it, a member leaving for a new round) and ends where training resumed: when
every member of a later round trained in it (its workers started anew, or kept ones formed it).
Each interruption is charged to what stopped the round before it. Not downtime: the start (before
the first round trained) and the end of a job that finished; a job that did not train again
before its logs end has its last interruption open to the end of the timeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from elastic.timeline.rounds import RoundSpan, Sign

__all__ = ["Interruption", "interruptions"]


@dataclass(frozen=True)
class Interruption:
    """The job did not train from ``start`` to ``end`` (on the clock of the spans) because of
    ``cause``, which stopped round ``stopped_round``; ``resumed``: training resumed at ``end``
    (in round ``resumed_in``), else the logs end first."""

    start: float
    end: float
    cause: Sign
    stopped_round: int
    resumed: bool
    resumed_in: int | None

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


def interruptions(spans: Sequence[RoundSpan], end: float) -> tuple[Interruption, ...]:
    """The interruptions of each run in ``spans`` (sorted by start), in order; ``end``: where the
    logs end (for an interruption training never resumed from)."""
    found: list[Interruption] = []
    for run_id in dict.fromkeys(span.run_id for span in spans):
        trained = sorted((s for s in spans if s.run_id == run_id and s.trained), key=lambda s: s.start or 0.0)
        found += _gaps(trained, end)
    return tuple(sorted(found, key=lambda i: i.start))


def _gaps(trained: Sequence[RoundSpan], end: float) -> list[Interruption]:
    gaps: list[Interruption] = []
    stop: Sign | None = None
    stopped_round = -1
    for span in trained:
        assert span.start is not None and span.stop is not None  # trained
        if stop is not None and span.start > stop.at:
            gaps.append(Interruption(stop.at, span.start, stop, stopped_round, True, span.round))
        if stop is None or span.stop.at > stop.at:
            stop, stopped_round = span.stop, span.round
    if stop is not None and stop.kind != "finished" and end > stop.at:
        gaps.append(Interruption(stop.at, end, stop, stopped_round, False, None))
    return gaps
