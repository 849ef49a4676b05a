"""Prefix watches that survive etcd restarts and failover, resuming without loss or duplicates.

Each watch drives its own gRPC ``Watch`` stream (the etcd v3 API through the generated
``etcd3.etcdrpc`` stubs) from one daemon thread, and feeds a :class:`~backends.api.QueueWatch`.

Why not the ``etcd3`` library's watcher: when etcd restarts, its watcher thread dies with
``NameError: name 'six' is not defined`` and every watch on it is lost silently; it never
re-establishes a watch, allows one pending create at a time per client, and cannot resume
from a revision. Here a broken stream (an RPC error, the stream ending, a server-side cancel)
is reopened, on any endpoint, from ``delivered_revision + 1`` (or past the last progress
notification), so the consumer sees every event once. When history from there has been
compacted the watch fails with :class:`~backends.errors.CompactedError`; when no endpoint
answers within ``watch_reconnect_timeout`` it fails with
:class:`~backends.errors.BackendConnectionError`.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
from typing import Any, Callable, Iterator

import grpc
from etcd3 import etcdrpc

from backends.api import QueueWatch
from backends.errors import (
    BackendClosedError,
    BackendConnectionError,
    BackendError,
    BackendTimeoutError,
    CompactedError,
)
from backends.etcd.connection import CallOptions, EndpointChannel, EtcdConnection, persistent_policy
from backends.etcd.convert import encode_key, prefix_range_end, watch_event
from backends.etcd.translate import translate_watch_cancel

log = logging.getLogger(__name__)

_TRANSIENT = (BackendConnectionError, BackendTimeoutError)


class _Stream:
    """One open gRPC Watch stream carrying our single watch."""

    def __init__(
        self, call: Any, requests: "queue.SimpleQueue[Any]", channel: EndpointChannel, start_revision: int
    ) -> None:
        self.call = call
        self.requests = requests
        self.channel = channel
        self.start_revision = start_revision
        self.watch_id: int | None = None
        self.expired = False
        self._closed = False

    def expire(self) -> None:
        """Abort the stream because the server did not confirm the watch in time."""
        self.expired = True
        self.call.cancel()

    def close(self) -> None:
        """Cancel the watch on the server, half-close the stream, and cancel the RPC; idempotent.

        Half-closing also ends gRPC's thread that consumes our request queue.
        """
        if self._closed:
            return
        self._closed = True
        if self.watch_id is not None:
            cancel = etcdrpc.WatchCancelRequest(watch_id=self.watch_id)
            self.requests.put(etcdrpc.WatchRequest(cancel_request=cancel))
        self.requests.put(None)
        self.call.cancel()


def _drain(requests: "queue.SimpleQueue[Any]") -> Iterator[Any]:
    while (request := requests.get()) is not None:
        yield request


class ResumingWatch:
    """Keeps one prefix watch alive and feeds :attr:`watch` (see the module docstring).

    Call :meth:`start` once; the owner ends it with ``watch.cancel()``.
    """

    def __init__(
        self,
        connection: EtcdConnection,
        prefix: str,
        start_revision: int,
        on_done: Callable[["ResumingWatch"], None] = lambda _watch: None,
    ) -> None:
        self.watch = QueueWatch(start_revision, on_cancel=self._on_cancel)
        self._connection = connection
        self._prefix = prefix
        self._key = encode_key(prefix)
        self._range_end = prefix_range_end(self._key)
        self._on_done = on_done
        self._progress_revision = 0
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._stream: _Stream | None = None
        budget = connection.config.watch_reconnect_timeout
        self._budget = budget
        self._policy = dataclasses.replace(persistent_policy(connection.config.retry, budget), sleep=self._stopped.wait)
        self._thread = threading.Thread(target=self._run, name=f"etcd-watch {prefix}", daemon=True)

    @property
    def resume_revision(self) -> int:
        """First revision a new stream must ask for: nothing at or below it is missing."""
        return max(self.watch.delivered_revision, self._progress_revision) + 1

    def start(self) -> None:
        self._thread.start()

    # -- the producer thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopped.is_set():
                stream = self._connection.call(
                    f"watch {self._prefix!r}", self._open, budget=self._budget, policy=self._policy
                )
                try:
                    self._pump(stream)
                finally:
                    stream.close()
        except BackendError as error:
            self._fail(error)
        except Exception as error:  # a bug must not end the watch silently
            log.exception("etcd watch on %r: internal error", self._prefix)
            self._fail(BackendError(f"etcd watch on {self._prefix!r} stopped on an internal error: {error!r}"))

    def _fail(self, error: BackendError) -> None:
        if self._stopped.is_set():
            return
        log.warning("etcd watch on %r failed: %s", self._prefix, error)
        self.watch.fail(error)

    def _open(self, channel: EndpointChannel, options: CallOptions) -> _Stream:
        """Open a stream on ``channel`` and wait (up to the request timeout) for the watch to be created."""
        revision = self.resume_revision
        create = etcdrpc.WatchCreateRequest(
            key=self._key, range_end=self._range_end, start_revision=revision, progress_notify=True
        )
        requests: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        requests.put(etcdrpc.WatchRequest(create_request=create))
        call = channel.watch.Watch(_drain(requests), metadata=options.metadata, wait_for_ready=False)
        stream = _Stream(call, requests, channel, revision)
        with self._lock:
            if self._stopped.is_set():
                stream.close()
                raise BackendClosedError(f"etcd watch on {self._prefix!r} was cancelled.")
            self._stream = stream
        try:
            self._await_created(stream, options.timeout)
        except BaseException:
            stream.close()
            raise
        return stream

    def _await_created(self, stream: _Stream, timeout: float) -> None:
        timer = threading.Timer(timeout, stream.expire)
        timer.start()
        try:
            created = next(stream.call)
        except grpc.RpcError as error:
            if stream.expired:
                raise BackendTimeoutError(
                    f"etcd at {stream.channel} did not confirm the watch on {self._prefix!r} within {timeout:.3g}s."
                ) from error
            raise
        except StopIteration:
            raise BackendConnectionError(
                f"etcd at {stream.channel} closed the watch stream before creating the watch on {self._prefix!r}."
            ) from None
        finally:
            timer.cancel()
        stream.watch_id = created.watch_id
        self._handle(created, stream)
        log.debug("etcd watch on %r created at revision %d on %s", self._prefix, stream.start_revision, stream.channel)

    def _pump(self, stream: _Stream) -> None:
        """Deliver events until the stream breaks; returns to resume, raises to fail the watch."""
        try:
            for response in stream.call:
                self._handle(response, stream)
        except grpc.RpcError as error:
            if self._stopped.is_set():
                return
            translated = self._connection.translate(error, f"watch {self._prefix!r}", stream.channel, None)
            if not isinstance(translated, _TRANSIENT):
                raise translated from error
            log.warning(
                "etcd watch on %r lost (%s); resuming from revision %d", self._prefix, translated, self.resume_revision
            )
            return
        except _TRANSIENT as error:
            if self._stopped.is_set():
                return  # cancelled by its owner: not a loss
            log.warning(
                "etcd watch on %r lost (%s); resuming from revision %d", self._prefix, error, self.resume_revision
            )
            return
        if not self._stopped.is_set():
            log.warning("etcd watch on %r: stream ended; resuming from revision %d", self._prefix, self.resume_revision)

    def _handle(self, response: Any, stream: _Stream) -> None:
        if response.compact_revision:
            raise CompactedError(
                f"etcd watch on {self._prefix!r} asked for history from revision {stream.start_revision}, but etcd "
                f"compacted it up to revision {response.compact_revision}; re-read the current state and watch "
                "from its revision.",
                requested_revision=stream.start_revision,
                compact_revision=response.compact_revision,
            )
        if response.canceled:
            raise translate_watch_cancel(response.cancel_reason, prefix=self._prefix, endpoint=str(stream.channel))
        if response.events:
            self.watch.deliver([watch_event(event) for event in response.events])
        elif not response.created:
            # A progress notification: every event up to header.revision has been sent.
            self._progress_revision = max(self._progress_revision, response.header.revision)

    # -- cancellation (consumer side) --------------------------------------------------------
    def _on_cancel(self) -> None:
        self._stopped.set()
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
        self._on_done(self)
