"""``TcpStoreBackend``: the key-value contract over one multiplexed connection to a TCP store.

The client connects lazily (or at :meth:`TcpStoreBackend.connect`) and again on the next call
after the connection is lost. Live watches survive a lost connection for as long as it takes
(the contract, :mod:`backends.api`): a background thread reconnects and resubscribes each from
the revision after the last one it delivered, warning every ``watch_resume_timeout`` seconds
while the store does not answer. If the store came back with fresh state (another store id in
the handshake) or no longer has that history, the watches fail with CompactedError saying so;
a store that refuses (auth, protocol) fails them with that error. Every foreign error is translated into
:mod:`backends.errors` at this boundary.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from functools import partial
from typing import Any, Callable

from backends.api import (
    NO_LEASE,
    KVBackend,
    Lease,
    QueueWatch,
    RangeResult,
    ReadResult,
    Watch,
    WatchEvent,
    WriteResult,
)
from backends.errors import (
    BackendAuthError,
    BackendClosedError,
    BackendError,
    CompactedError,
    ProtocolError,
    ValueTooLargeError,
)
from backends.retry import RetryPolicy
from backends.tcp.config import TcpStoreConfig
from backends.tcp.connection import Connection
from backends.tcp.protocol import Frame, PayloadReader, error_from_wire
from backends.tcp.txnwire import decode_result, encode_txn
from backends.txn import Txn, TxnResult, check_txn

__all__ = ["TcpStoreBackend"]

log = logging.getLogger(__name__)

_RESUME_BACKOFF = RetryPolicy(initial_backoff=0.05, max_backoff=1.0)


class _LiveWatch:
    """Client-side state of one watch: where it resumes from, and its current subscription."""

    def __init__(self, prefix: str, start_revision: int | None, on_cancel: Callable[["_LiveWatch"], None]) -> None:
        self.prefix = prefix
        self.start_revision = start_revision or 0  # raised to the server's answer for "from now"
        self.subscription = 0  # request id of the current server-side watch
        self.queue = QueueWatch(start_revision or 0, on_cancel=lambda: on_cancel(self))
        self._deliver_lock = threading.Lock()

    def resume_revision(self) -> int:
        return max(self.queue.delivered_revision + 1, self.start_revision)

    def subscribed(self, frame: Frame) -> None:
        start = frame.header.get("s")
        if isinstance(start, int):
            self.start_revision = max(self.start_revision, start)
            self.queue.begin_after(start - 1)

    def deliver(self, events: list[WatchEvent]) -> None:
        with self._deliver_lock:  # an old and a new connection's readers may overlap briefly
            self.queue.deliver(events)


class TcpStoreBackend(KVBackend):
    """A thread-safe client of the built-in TCP store; see the module docstring."""

    def __init__(self, config: TcpStoreConfig) -> None:
        self.config = config
        self.max_value_bytes = KVBackend.max_value_bytes
        self._ids = itertools.count(1)
        self._connect_lock = threading.Lock()
        self._connection_: Connection | None = None
        self._closed = False
        self._closed_event = threading.Event()
        self._store_id: str | None = None
        self._watch_lock = threading.Lock()
        self._live: set[_LiveWatch] = set()
        self._subscriptions: dict[int, _LiveWatch] = {}
        self._resuming = False

    def connect(self) -> "TcpStoreBackend":
        """Connect now rather than on the first call; returns self.

        Raises:
            BackendConnectionError, BackendTimeoutError, BackendAuthError, ProtocolError: see
                :meth:`backends.tcp.connection.Connection.open`.
        """
        self._connection()
        return self

    # -- reads --------------------------------------------------------------------------------
    def get(self, key: str) -> ReadResult:
        frame = self._request({"op": "get", "k": key})
        return _decode(frame, lambda h, r: ReadResult(h["r"], r.kv_or_none(h["kv"])))

    def get_prefix(self, prefix: str) -> RangeResult:
        frame = self._request({"op": "range", "p": prefix})
        return _decode(frame, lambda h, r: RangeResult(h["r"], tuple(r.kv(item) for item in h["kvs"])))

    # -- writes -------------------------------------------------------------------------------
    def put(self, key: str, value: bytes, *, lease: int = NO_LEASE) -> int:
        self._check_value(key, value)
        frame = self._request({"op": "put", "k": key, "l": lease}, (value,))
        return _decode(frame, lambda h, r: int(h["r"]))

    def txn(self, txn: Txn) -> TxnResult:
        """One ``txn`` request, run by the store under its lock (see :mod:`backends.tcp.txnwire`)."""
        check_txn(txn, self.max_value_bytes)
        parts: list[bytes] = []
        frame = self._request({"op": "txn", "t": encode_txn(txn, parts)}, tuple(parts))
        return decode_result(frame.header, frame.payload)

    def delete(self, key: str) -> WriteResult:
        return _decode(self._request({"op": "del", "k": key}), _write_result)

    def delete_prefix(self, prefix: str) -> int:
        return _decode(self._request({"op": "del_prefix", "p": prefix}), lambda h, r: int(h["n"]))

    # -- leases -------------------------------------------------------------------------------
    def grant(self, ttl: float) -> Lease:
        if not ttl > 0:
            raise ValueError(f"The lease TTL ({ttl}) must be positive.")
        frame = self._request({"op": "grant", "ttl": ttl})
        return _decode(frame, lambda h, r: Lease(int(h["lease"]), float(h["ttl"])))

    def keepalive(self, lease_id: int) -> float:
        return _decode(self._request({"op": "keepalive", "lease": lease_id}), lambda h, r: float(h["ttl"]))

    def revoke(self, lease_id: int) -> bool:
        return _decode(self._request({"op": "revoke", "lease": lease_id}), lambda h, r: bool(h["a"]))

    # -- watches and history ------------------------------------------------------------------
    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> Watch:
        if start_revision is not None and start_revision < 1:
            raise ValueError(f"The watch start revision ({start_revision}) must be at least 1.")
        live = _LiveWatch(prefix, start_revision, self._cancel_watch)
        connection = self._connection()
        connection.read_in_background()
        subscription = self._subscribe(live)
        try:
            frame = connection.request(
                {"op": "watch", "p": prefix, "s": start_revision},
                timeout=self.config.request_timeout,
                request_id=subscription,
                on_reply=live.subscribed,
            )
        except BackendError:
            self._forget(live)
            raise
        if "err" in frame.header:
            self._forget(live)
            raise error_from_wire(frame.header)
        return live.queue

    def compact(self, revision: int) -> None:
        self._request({"op": "compact", "r": revision})

    # -- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        self._closed = True
        self._closed_event.set()
        with self._watch_lock:
            lives = list(self._live)
            self._live.clear()
            self._subscriptions.clear()
        for live in lives:
            live.queue.cancel()
        with self._connect_lock:
            connection, self._connection_ = self._connection_, None
        if connection is not None:
            connection.close()
            connection.dispose()

    # -- requests -----------------------------------------------------------------------------
    def _request(self, header: dict[str, Any], parts: tuple[bytes, ...] = ()) -> Frame:
        frame = self._connection().request(header, parts, timeout=self.config.request_timeout)
        if "err" in frame.header:
            raise error_from_wire(frame.header)
        return frame

    def _check_value(self, key: str, value: bytes) -> None:
        if len(value) > self.max_value_bytes:
            raise ValueTooLargeError(
                f"The value for {key!r} is {len(value)} bytes; the store accepts at most {self.max_value_bytes}."
            )

    def _connection(self) -> Connection:
        if self._closed:
            raise BackendClosedError("The TCP store client is closed.")
        connection = self._connection_
        if connection is not None and connection.alive:
            return connection
        with self._connect_lock:
            connection = self._connection_
            if connection is not None and connection.alive:
                return connection
            if connection is not None:
                connection.dispose()  # its readers leave first, so its last pushes come first
            connection = self._open()
            self._connection_ = connection
            self.max_value_bytes = connection.hello.max_value_bytes
            self._adopt(connection)
            return connection

    def _open(self) -> Connection:
        config = self.config
        connection = Connection.open(
            config.address,
            config.token,
            connect_timeout=config.connect_timeout,
            request_timeout=config.request_timeout,
            max_frame_bytes=config.max_frame_bytes,
            ids=self._ids,
            on_push=self._on_push,
            on_lost=self._on_lost,
        )
        if self._closed:
            connection.close()
            raise BackendClosedError("The TCP store client is closed.")
        return connection

    # -- watch plumbing -----------------------------------------------------------------------
    def _subscribe(self, live: _LiveWatch) -> int:
        subscription = next(self._ids)
        with self._watch_lock:
            self._subscriptions.pop(live.subscription, None)
            self._subscriptions[subscription] = live
            live.subscription = subscription
            self._live.add(live)
        return subscription

    def _forget(self, live: _LiveWatch) -> None:
        with self._watch_lock:
            self._live.discard(live)
            self._subscriptions.pop(live.subscription, None)

    def _end_watch(self, live: _LiveWatch, error: BackendError) -> None:
        self._forget(live)
        live.queue.fail(error)

    def _cancel_watch(self, live: _LiveWatch) -> None:
        with self._watch_lock:
            known = live in self._live
        self._forget(live)
        connection = self._connection_
        if not known or connection is None or not connection.alive:
            return
        try:
            connection.submit({"op": "unwatch", "w": live.subscription}, request_id=next(self._ids),
                              on_reply=lambda frame: None)
        except BackendError:
            pass  # the connection is gone, and the server-side watch with it

    def _on_push(self, frame: Frame) -> None:
        header = frame.header
        live = self._subscriptions.get(header.get("w"))  # type: ignore[arg-type]
        if live is None:
            return  # cancelled, or superseded by a resubscription
        if "err" in header:
            self._end_watch(live, _as_backend_error(error_from_wire(header)))
            return
        reader = PayloadReader(frame.payload)
        items = header.get("ev")
        if not isinstance(items, list):
            raise ProtocolError("A watch push lacks its events.")
        live.deliver([reader.event(item) for item in items])

    def _adopt(self, connection: Connection) -> None:
        """Called with a new connection: resubscribe live watches, or fail them if the store is new."""
        previous, self._store_id = self._store_id, connection.hello.store_id
        with self._watch_lock:
            lives = list(self._live)
        if previous is not None and previous != connection.hello.store_id:
            for live in lives:
                self._end_watch(live, self._restarted_error(live, previous, connection))
            return
        if lives:
            connection.read_in_background()
        for live in lives:
            subscription = self._subscribe(live)
            header = {"op": "watch", "p": live.prefix, "s": live.resume_revision()}
            try:
                connection.submit(header, request_id=subscription, on_reply=partial(self._resubscribed, live))
            except BackendError:
                return  # lost again; the resume thread tries again

    def _resubscribed(self, live: _LiveWatch, frame: Frame) -> None:
        if "err" in frame.header:
            self._end_watch(live, _as_backend_error(error_from_wire(frame.header)))

    def _restarted_error(self, live: _LiveWatch, previous: str, connection: Connection) -> CompactedError:
        revision = live.resume_revision()
        return CompactedError(
            f"The elastic-store at {self.config.address} restarted with fresh state (store id {previous} "
            f"is now {connection.hello.store_id}); its history is gone, so the watch on {live.prefix!r} "
            f"cannot resume from revision {revision}. Re-read the keys and watch again.",
            requested_revision=revision,
            compact_revision=connection.hello.compact_revision,
        )

    def _on_lost(self, connection: Connection) -> None:
        with self._watch_lock:
            if self._closed or not self._live or self._resuming:
                return
            self._resuming = True
        threading.Thread(target=self._resume_watches, name="elastic-store-watch-resume", daemon=True).start()

    def _resume_watches(self) -> None:
        """Reconnect until live watches are resubscribed (or cancelled, or the client closed)."""
        started = time.monotonic()
        warn_at = started + self.config.watch_resume_timeout
        attempt = 0
        while True:
            with self._watch_lock:
                connection = self._connection_
                if self._closed or not self._live or (connection is not None and connection.alive):
                    self._resuming = False
                    return
            try:
                self._connection()
                continue
            except (BackendAuthError, ProtocolError, BackendClosedError) as error:
                self._fail_live_watches(error)
                continue
            except BackendError as error:
                if time.monotonic() >= warn_at:
                    warn_at = time.monotonic() + self.config.watch_resume_timeout
                    log.warning("elastic-store client %s: %d watches have waited %.0fs for the store to answer (%s); "
                                "still resuming", self.config.address, len(self._live), time.monotonic() - started,
                                error)
            attempt += 1
            self._closed_event.wait(_RESUME_BACKOFF.backoff(attempt))

    def _fail_live_watches(self, error: BackendError) -> None:
        with self._watch_lock:
            lives = list(self._live)
        for live in lives:
            log.warning("elastic-store client %s: watch on %r failed: %s", self.config.address, live.prefix, error)
            self._end_watch(live, error)


def _write_result(header: dict[str, Any], reader: PayloadReader) -> WriteResult:
    return WriteResult(bool(header["a"]), int(header["r"]), reader.kv_or_none(header["kv"]))


def _decode(frame: Frame, build: Callable[[dict[str, Any], PayloadReader], Any]) -> Any:
    """Build a result from a response frame, translating malformed responses to ProtocolError."""
    try:
        return build(frame.header, PayloadReader(frame.payload))
    except (KeyError, TypeError, ValueError, IndexError) as error:
        raise ProtocolError(f"The elastic-store sent a malformed response ({error!r}).") from error


def _as_backend_error(error: Exception) -> BackendError:
    return error if isinstance(error, BackendError) else ProtocolError(str(error))

