"""The TCP store server's bounds on what peers can make it hold, with defaults sane for a job.

Everything a peer can send is bounded, so a store's memory stays bounded too: the frames it
buffers (small until the handshake succeeds), the header it parses, how many connections
and handshakes it keeps, the watches of one connection, and what it queues for a client that
reads too slowly. Keys, values and history are bounded by :class:`~backends.kvstate.KVState`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["PRE_AUTH_FRAME_BYTES", "StoreLimits"]

PRE_AUTH_FRAME_BYTES = 8 * 1024
"""Largest frame before a client has authenticated (the hello is ~100 bytes plus the token)."""


@dataclass(frozen=True)
class StoreLimits:
    """Per-server bounds; each is enforced with an error the client can read.

    Attributes:
        max_header_bytes: largest JSON header of a request (refused from the length prefix,
            before it is buffered or parsed).
        max_connections: connections served at once; more are refused ("busy").
        max_pending_connections: connections still in the handshake; a new one beyond it
            evicts the oldest, so idle strangers cannot lock clients out.
        max_watches_per_connection: live watches one connection may hold.
        max_write_buffer_bytes: bytes queued for a client beyond the frame being sent; a client
            that lets more pile up reads too slowly and is dropped.

    Raises (from the constructor):
        ValueError: a bound is not a positive integer, or more pending than total connections.
    """

    max_header_bytes: int = 256 * 1024
    max_connections: int = 1024
    max_pending_connections: int = 256
    max_watches_per_connection: int = 4096
    max_write_buffer_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if type(value) is not int or value < 1:
                raise ValueError(f"The store limit {item.name} ({value!r}) must be a positive integer.")
        if self.max_pending_connections > self.max_connections:
            raise ValueError(
                f"The store limit max_pending_connections ({self.max_pending_connections}) must not exceed "
                f"max_connections ({self.max_connections})."
            )

    def request_frame_bytes(self, max_value_bytes: int) -> int:
        """Largest request frame (after its length prefix): a header and two values' worth of payload
        (what one transaction's values may add up to)."""
        return 4 + self.max_header_bytes + 2 * max_value_bytes
