"""The request side of one gRPC client stream (Watch, LeaseKeepAlive), fed from any thread."""

from __future__ import annotations

import queue
from typing import Any, Callable


class RequestQueue:
    """The requests of one client stream, in order; ``put(None)`` ends the stream (half-close).

    grpcio iterates it from the stream's request thread, which blocks in ``__next__`` until
    a request or the end arrives. Unbounded on purpose: only our own code puts requests here
    (one per watch create/cancel or lease renewal), never a peer.

    ``idle()``, when given, is asked for a request whenever none was queued for ``idle_after``
    seconds (the watch stream's progress requests: no thread of their own); it returns None
    when there is nothing to send.
    """

    def __init__(self, idle: Callable[[], Any] | None = None, idle_after: float = 0.0) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._idle = idle
        self._idle_after = idle_after

    def put(self, request: Any) -> None:
        """Queue ``request`` for sending; ``None`` half-closes the stream after what is queued."""
        self._queue.put(request)

    def __iter__(self) -> "RequestQueue":
        return self

    def __next__(self) -> Any:
        while True:
            if self._idle is None:
                request = self._queue.get()
            else:
                try:
                    request = self._queue.get(timeout=self._idle_after)
                except queue.Empty:
                    request = self._idle()
                    if request is None:
                        continue
            if request is None:
                raise StopIteration
            return request
