"""The request side of one gRPC client stream (Watch, LeaseKeepAlive), fed from any thread."""

from __future__ import annotations

import queue
from typing import Any


class RequestQueue:
    """The requests of one client stream, in order; ``put(None)`` ends the stream (half-close).

    grpcio iterates it from the stream's request thread, which blocks in ``__next__`` until
    a request or the end arrives. Unbounded on purpose: only our own code puts requests here
    (one per watch create/cancel or lease renewal), never a peer.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def put(self, request: Any) -> None:
        """Queue ``request`` for sending; ``None`` half-closes the stream after what is queued."""
        self._queue.put(request)

    def __iter__(self) -> "RequestQueue":
        return self

    def __next__(self) -> Any:
        request = self._queue.get()
        if request is None:
            raise StopIteration
        return request
