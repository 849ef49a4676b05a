"""The event history of a :class:`~backends.kvstate.KVState`: what watches that start in the past replay.

Passive like the state that owns it (no I/O, no threads, not thread-safe). Bounded by a count of
events and by the bytes of their keys and values, so a flood of large overwrites cannot keep
gigabytes; beyond either bound the oldest whole revisions are compacted away, never the newest.
"""

from __future__ import annotations

from collections import deque

from backends.api import WatchEvent
from backends.errors import CompactedError

__all__ = ["DEFAULT_HISTORY_BYTES", "DEFAULT_HISTORY_LIMIT", "EVENT_OVERHEAD_BYTES", "EventHistory"]

DEFAULT_HISTORY_LIMIT = 10_000
"""Events kept for watches that start in the past; older ones are compacted away."""

DEFAULT_HISTORY_BYTES = 64 * 1024 * 1024
"""Bytes of keys and values the history keeps at most (each event also counts
:data:`EVENT_OVERHEAD_BYTES`); without it 10,000 overwrites of a 1 MiB value would keep ~10 GiB."""

EVENT_OVERHEAD_BYTES = 200
"""What one kept event costs beyond its key and value (objects and references), for the history bound."""


class EventHistory:
    """The events from :attr:`compact_revision` on, in revision order.

    Args:
        limit: events kept at most.
        max_bytes: bytes of keys and values kept at most (the newest revision always stays).
    """

    def __init__(self, limit: int, max_bytes: int) -> None:
        self._limit = limit
        self._max_bytes = max_bytes
        self._bytes = 0
        self._compact_revision = 1
        self._events: deque[WatchEvent] = deque()

    @property
    def compact_revision(self) -> int:
        """The oldest revision whose events are still kept; watches may start there or later."""
        return self._compact_revision

    def append(self, events: list[WatchEvent]) -> None:
        """Keep the events of one new revision, then compact what passes the bounds."""
        newest = events[0].revision
        history = self._events
        history.extend(events)
        self._bytes += sum(_event_bytes(event) for event in events)
        if len(history) > self._limit:
            overflow = history[len(history) - self._limit - 1]
            self._compact_revision = max(self._compact_revision, overflow.revision + 1)
        self._trim()
        while self._bytes > self._max_bytes and history[0].revision < newest:
            self._compact_revision = history[0].revision + 1  # whole revisions go, the newest stays
            self._trim()

    def since(self, prefix: str, start_revision: int) -> list[WatchEvent]:
        """Events under ``prefix`` at ``start_revision`` or later, in revision order.

        Raises:
            ValueError: ``start_revision`` is below 1.
            CompactedError: events before ``start_revision`` that it needs are gone.
        """
        if start_revision < 1:
            raise ValueError(f"The start revision ({start_revision}) must be at least 1.")
        if start_revision < self._compact_revision:
            raise CompactedError(
                f"History before revision {self._compact_revision} was compacted; "
                f"a watch cannot start at revision {start_revision}. Re-read the state and watch from now.",
                requested_revision=start_revision,
                compact_revision=self._compact_revision,
            )
        found: list[WatchEvent] = []
        for event in reversed(self._events):
            if event.revision < start_revision:
                break
            if event.kv.key.startswith(prefix):
                found.append(event)
        found.reverse()
        return found

    def compact(self, revision: int) -> None:
        """Discard the events before ``revision``; compacting to an older revision is a no-op."""
        self._compact_revision = max(self._compact_revision, revision)
        self._trim()

    def _trim(self) -> None:
        history = self._events
        while history and history[0].revision < self._compact_revision:
            self._bytes -= _event_bytes(history.popleft())


def _event_bytes(event: WatchEvent) -> int:
    """What keeping ``event`` in the history costs, roughly (keys are counted in characters)."""
    return len(event.kv.key) + len(event.kv.value) + EVENT_OVERHEAD_BYTES
