"""The contract's value types: keys as stored, read and write results, leases, watch events.

Plain frozen data shared by :mod:`backends.api` (the contract), :mod:`backends.txn` (typed
transactions) and :mod:`backends.session`, so none of them imports another for its types.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "ABSENT",
    "Absent",
    "EventType",
    "KeyValue",
    "Lease",
    "NO_LEASE",
    "RangeResult",
    "ReadResult",
    "WatchEvent",
    "WriteResult",
]


class Absent(enum.Enum):
    """Marker type for "the key must not exist" in conditional writes."""

    ABSENT = "absent"

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = Absent.ABSENT
"""Pass as ``expected`` to :meth:`KVBackend.put_if` to create a key only if it is absent."""

NO_LEASE = 0
"""Lease id meaning "not bound to a lease"."""


@dataclass(frozen=True)
class KeyValue:
    """One key as stored.

    Attributes:
        key: the key.
        value: the value bytes (empty for a DELETE event).
        create_revision: store revision at which the key was created (0 for a DELETE event).
        mod_revision: store revision of the last write to the key (the deletion, for a DELETE).
        version: number of writes since creation (0 for a DELETE event).
        lease: id of the lease the key is bound to, or 0.
    """

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int = 1
    lease: int = NO_LEASE


@dataclass(frozen=True)
class ReadResult:
    """Result of :meth:`KVBackend.get`: the key (or None) and the store revision of the read."""

    revision: int
    kv: KeyValue | None


@dataclass(frozen=True)
class RangeResult:
    """Keys in key order, read at one store revision (:meth:`KVBackend.get_prefix`, a txn's Range).

    ``count`` is how many keys matched: ``len(kvs)``, or the number alone for a count-only range.
    """

    revision: int
    kvs: tuple[KeyValue, ...]
    count: int = -1

    def __post_init__(self) -> None:
        if self.count < 0:
            object.__setattr__(self, "count", len(self.kvs))


@dataclass(frozen=True)
class WriteResult:
    """Result of a conditional write.

    Attributes:
        applied: whether the write happened.
        revision: the store revision after the operation (the write's revision if applied).
        current: the key as it is after the operation: the new value if a put applied, None
            if a delete applied; if not applied, what the key holds now (None if absent).
    """

    applied: bool
    revision: int
    current: KeyValue | None


@dataclass(frozen=True)
class Lease:
    """A granted lease: its id and the TTL the server granted, in seconds."""

    id: int
    ttl: float


class EventType(enum.Enum):
    """Kind of change a watch reports."""

    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True)
class WatchEvent:
    """One change under a watched prefix.

    For DELETE events ``kv.value`` is empty and ``kv.mod_revision`` is the deletion revision.
    """

    type: EventType
    kv: KeyValue

    @property
    def revision(self) -> int:
        """Store revision at which this change happened."""
        return self.kv.mod_revision
