"""One watch and one stream of a :class:`~backends.etcd.watch.WatchHub`: the state the hub keeps.

:class:`WatchRegistration` is a consumer's prefix watch and its resume point (the revision a
re-created watch starts from, moved on by delivered events and progress reports);
:class:`WatchStream` is one open gRPC Watch stream and the registrations on it. Both are
mutated only under the hub's lock; the hub's module docstring says how they are used.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable

from etcd3 import etcdrpc

from backends.api import QueueWatch
from backends.errors import BackendError
from backends.etcd.connection import EndpointChannel
from backends.etcd.convert import encode_key, prefix_range_end
from backends.etcd.request_queue import RequestQueue


__all__ = ["WatchRegistration", "WatchStream"]


class WatchRegistration:
    """One consumer's prefix watch: its queue, its resume point, and its state on the stream.
    ``cancel`` (the hub's) is called with the registration when its watch is cancelled.

    Attributes:
        watch: what the consumer reads; cancelling it cancels the registration.
        requested_revision: the start revision of the most recent create (for error messages).
        started: set once etcd confirmed the watch (or it ended); a watch "from now" (start
            revision None) learns its start from that confirmation.
    """

    def __init__(self, cancel: Callable[["WatchRegistration"], None], prefix: str,
                 start_revision: int | None) -> None:
        self.prefix = prefix
        self.key = encode_key(prefix)
        self.range_end = prefix_range_end(self.key)
        self.watch = QueueWatch(start_revision or 0, on_cancel=lambda: cancel(self))
        self.from_now = start_revision is None
        self.requested_revision = start_revision or 0
        self.progress_revision = 0
        self.progress_candidate = 0  # the last stream-wide report, adopted when the next one comes
        self.cancelled = False
        self.reauthenticated = False  # refused once for auth and re-sent with a fresh token
        self.started = threading.Event()
        if not self.from_now:
            self.started.set()

    def __repr__(self) -> str:
        return f"WatchRegistration({self.prefix!r}, resume at {self.resume_revision})"

    @property
    def resume_revision(self) -> int:
        """First revision a (re)created watch must ask for: nothing at or below it is missing.

        0 (etcd's "from now") for a watch from now that etcd has not confirmed yet: its
        consumer is still waiting to learn where it starts.
        """
        if not self.started.is_set():
            return 0
        return max(self.watch.delivered_revision, self.progress_revision) + 1

    def mark_started(self, revision: int) -> None:
        """etcd confirmed the watch at store revision ``revision`` (a watch from now reports what follows it)."""
        if not self.started.is_set():
            if self.from_now:
                self.watch.begin_after(revision)
            self.started.set()

    def fail(self, error: BackendError) -> None:
        """End the watch with ``error``, releasing a creator still waiting for it to start."""
        self.watch.fail(error)
        self.started.set()

    def create_request(self) -> Any:
        """The create message for this watch, starting at its resume point."""
        self.requested_revision = self.resume_revision
        self.progress_candidate = 0  # a report from another stream proves nothing about this one
        create = etcdrpc.WatchCreateRequest(
            key=self.key, range_end=self.range_end, start_revision=self.requested_revision, progress_notify=True
        )
        return etcdrpc.WatchRequest(create_request=create)

    def note_progress(self, revision: int) -> None:
        """A progress notification: every event up to ``revision`` has been sent."""
        self.progress_revision = max(self.progress_revision, revision)

    def note_stream_progress(self, revision: int) -> None:
        """A stream-wide report (the answer to a progress request) at store revision ``revision``.

        Adopts the previous report instead (see :mod:`backends.etcd.watch`): by the time this
        one arrived, every event at or below the previous one's revision has been sent.
        """
        self.progress_revision = max(self.progress_revision, self.progress_candidate)
        self.progress_candidate = max(self.progress_candidate, revision)


class WatchStream:
    """One open gRPC Watch stream and the watches on it.

    ``pending`` holds registrations whose create is not confirmed yet, in sending order;
    ``by_id`` / ``id_of`` map confirmed watches both ways. Mutated only under the hub's lock.
    """

    def __init__(
        self, call: Any, requests: RequestQueue, channel: EndpointChannel, token: str | None = None
    ) -> None:
        self.call = call
        self.requests = requests
        self.channel = channel
        self.token = token  # the auth token the stream was opened with (etcd checks it on every create)
        self.pending: collections.deque[WatchRegistration] = collections.deque()
        self.by_id: dict[int, WatchRegistration] = {}
        self.id_of: dict[WatchRegistration, int] = {}
        self.expired = False
        self.renewing_token = False  # ended on purpose, to re-create its watches with a new token
        self._closed = False

    def create(self, registration: WatchRegistration) -> None:
        self.pending.append(registration)
        self.requests.put(registration.create_request())

    def confirm(self, registration: WatchRegistration, watch_id: int) -> None:
        self.by_id[watch_id] = registration
        self.id_of[registration] = watch_id

    def forget(self, registration: WatchRegistration) -> int | None:
        """Drop a confirmed registration; returns its watch id (None if it was not confirmed)."""
        watch_id = self.id_of.pop(registration, None)
        if watch_id is not None:
            self.by_id.pop(watch_id, None)
        return watch_id

    def cancel_on_server(self, watch_id: int) -> None:
        self.requests.put(etcdrpc.WatchRequest(cancel_request=etcdrpc.WatchCancelRequest(watch_id=watch_id)))

    def expire(self) -> None:
        """Abort the stream because the server did not answer in time."""
        self.expired = True
        self.call.cancel()

    def close(self) -> None:
        """Half-close the stream (ending gRPC's request thread) and cancel the RPC; idempotent."""
        if self._closed:
            return
        self._closed = True
        self.requests.put(None)
        self.call.cancel()
