"""The leases of a :class:`~backends.kvstate.KVState`: live records and their expiry heap, bounded.

Passive like the state that owns it (no I/O, no threads, not thread-safe; time from an injected
monotonic clock). Bounded against a peer that holds the store's token: at most ``max_leases``
live leases, and an expiry heap of at most about twice as many entries. A keepalive pushes a
new entry and leaves the superseded one, which is dropped when it reaches the top; behind a
live lease with a far deadline nobody renews, superseded entries once piled up, one per
keepalive (+65 MiB in 30 s of renewals), so the heap is rebuilt from the live leases when it
grows past that.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field
from typing import Callable

from backends.api import NO_LEASE
from backends.errors import LeaseNotFoundError, LimitExceededError

__all__ = ["DEFAULT_MAX_LEASES", "LeaseRecord", "LeaseTable"]

DEFAULT_MAX_LEASES = 10_000
"""Live leases a store holds at most: one per node's session, and a few in flight."""

_HEAP_SLACK = 1024
"""Superseded expiry-heap entries tolerated beyond one per live lease before the heap is rebuilt."""


@dataclass
class LeaseRecord:
    """A live lease: its TTL, its monotonic deadline, and the keys bound to it."""

    id: int
    ttl: float
    deadline: float
    keys: set[str] = field(default_factory=set)


class LeaseTable:
    """Live leases by id, and when each expires.

    Args:
        clock: monotonic clock in seconds.
        max_leases: a grant beyond this many live leases raises :class:`LimitExceededError`.
        rng: source of lease ids.
    """

    def __init__(self, clock: Callable[[], float], max_leases: int, rng: random.Random) -> None:
        self.clock = clock
        self.max_leases = max_leases
        self._rng = rng
        self._records: dict[int, LeaseRecord] = {}
        self._heap: list[tuple[float, int]] = []

    def __len__(self) -> int:
        return len(self._records)

    @property
    def heap_size(self) -> int:
        """Entries in the expiry heap, superseded ones included (bounded, see the module)."""
        return len(self._heap)

    def get(self, lease_id: int) -> LeaseRecord | None:
        """The record of ``lease_id`` (even past its deadline, until it is swept), or None."""
        return self._records.get(lease_id)

    def live(self, lease_id: int) -> LeaseRecord:
        """The record of ``lease_id``, which must be live.

        Raises:
            LeaseNotFoundError: it is unknown, revoked, or past its deadline.
        """
        record = self._records.get(lease_id)
        if record is None or record.deadline <= self.clock():
            raise LeaseNotFoundError(f"Lease {lease_id:x} does not exist: it expired or was revoked.")
        return record

    def grant(self, ttl: float) -> LeaseRecord:
        """A new lease expiring ``ttl`` seconds from now; ids are unique, random and non-zero.

        Raises:
            ValueError: ``ttl`` is not a positive finite number.
            LimitExceededError: :attr:`max_leases` leases are live already.
        """
        if not (ttl > 0 and math.isfinite(ttl)):
            raise ValueError(f"The lease TTL ({ttl}) must be a positive number of seconds.")
        if len(self._records) >= self.max_leases:
            raise LimitExceededError(
                f"The store holds {len(self._records)} live leases, its limit (--max-leases); revoke leases no "
                "longer used (a node needs one), or raise the limit."
            )
        lease_id = NO_LEASE
        while lease_id == NO_LEASE or lease_id in self._records:
            lease_id = self._rng.getrandbits(63)
        record = LeaseRecord(lease_id, float(ttl), self.clock() + ttl)
        self._records[lease_id] = record
        self._push(record)
        return record

    def renew(self, lease_id: int) -> float:
        """Renew a live lease to its full TTL from now; returns the TTL.

        Raises:
            LeaseNotFoundError: it is unknown, revoked, or past its deadline.
        """
        record = self.live(lease_id)
        record.deadline = self.clock() + record.ttl
        self._push(record)
        return record.ttl

    def renew_all(self) -> None:
        """Give every lease its full TTL from now."""
        now = self.clock()
        for record in self._records.values():
            record.deadline = now + record.ttl
        self._rebuild()

    def pop(self, lease_id: int) -> LeaseRecord | None:
        """Remove ``lease_id``; its record, or None when unknown. Its heap entries go lazily."""
        return self._records.pop(lease_id, None)

    def next_expiry(self) -> float | None:
        """Clock time at which the next lease expires, or None when there are no leases."""
        heap = self._heap
        while heap:
            deadline, lease_id = heap[0]
            record = self._records.get(lease_id)
            if record is not None and record.deadline == deadline:
                return deadline
            heapq.heappop(heap)  # superseded by a keepalive, or the lease is gone
        return None

    def pop_due(self, now: float) -> int | None:
        """The id of a lease whose deadline is at or before ``now``, taken off the heap (the
        caller revokes it), or None when none is due."""
        deadline = self.next_expiry()
        if deadline is None or deadline > now:
            return None
        return heapq.heappop(self._heap)[1]

    def _push(self, record: LeaseRecord) -> None:
        heapq.heappush(self._heap, (record.deadline, record.id))
        if len(self._heap) > 2 * len(self._records) + _HEAP_SLACK:
            self._rebuild()

    def _rebuild(self) -> None:
        self._heap = [(record.deadline, record.id) for record in self._records.values()]
        heapq.heapify(self._heap)
