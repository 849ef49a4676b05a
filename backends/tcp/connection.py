"""One authenticated socket to a TCP store, shared by many threads.

Requests are tagged with ids and sent under a write lock. Reading uses a leader/follower
scheme so a lone caller never pays a thread hop (two cross-CPU wake-ups, most of a
round trip on loopback): the caller that finds the socket free reads it itself until its own
response arrives, handing any other frames to their owners; callers that find it busy wait
on their own lock and are either answered or promoted to reader when the reader leaves.
Once a watch exists, a background thread also reads whenever frames arrive and no caller
is reading, so pushes flow without any request. When the socket fails, every pending request
fails at once with BackendConnectionError and the owner is told.
"""

from __future__ import annotations

import logging
import select
import socket
import struct
import threading
import time
from typing import Any, Callable, Iterator, Sequence

from backends.endpoints import Endpoint
from backends.errors import (
    BackendClosedError,
    BackendConnectionError,
    BackendError,
    BackendTimeoutError,
    CompactedError,
    ProtocolError,
    ValueTooLargeError,
)
from backends.tcp.advice import dial_advice
from backends.tcp.handshake import Hello, handshake
from backends.tcp.protocol import (
    Frame,
    FrameDecoder,
    encode_frame,
    error_from_wire,
    tune_socket,
)

__all__ = ["Connection"]

log = logging.getLogger(__name__)

_RECV_BYTES = 64 * 1024
_RECEIVE_TIMEOUT_SLACK = 0.02
"""How far past its deadline a reading caller may block, to spare a setsockopt per request."""


class _Call:
    """A pending request. ``wake`` is released to signal it (answered, failed, or promoted)."""

    __slots__ = ("wake", "signalled", "waiter", "on_reply", "frame", "error")

    def __init__(self, on_reply: Callable[[Frame], None] | None, waiter: bool) -> None:
        self.wake = threading.Lock()
        self.wake.acquire()
        self.signalled = False
        self.waiter = waiter
        self.on_reply = on_reply
        self.frame: Frame | None = None
        self.error: BackendError | None = None


class Connection:
    """A connected, authenticated socket; see :meth:`open` and the module docstring."""

    def __init__(self, sock: socket.socket, endpoint: Endpoint, hello: Hello, decoder: FrameDecoder,
                 ids: Iterator[int], on_push: Callable[[Frame], None],
                 on_lost: Callable[["Connection"], None]) -> None:
        self.endpoint = endpoint
        self.hello = hello
        self._sock = sock
        self._decoder = decoder
        self._ids = ids
        self._on_push = on_push
        self._on_lost = on_lost
        self._lock = threading.Lock()  # guards _pending, _lost and every call's ``signalled``
        self._read_lock = threading.Lock()  # held by whoever reads the socket
        self._write_lock = threading.Lock()
        self._buffer = memoryview(bytearray(_RECV_BYTES))
        self._pending: dict[int, _Call] = {}
        self._lost: BackendError | None = None
        self._background: threading.Thread | None = None
        self._receive_timeout = 0.0  # SO_RCVTIMEO as last set; 0 is "none" (block forever)

    @classmethod
    def open(cls, endpoint: Endpoint, token: str | None, *, connect_timeout: float, request_timeout: float,
             max_frame_bytes: int, ids: Iterator[int], on_push: Callable[[Frame], None],
             on_lost: Callable[["Connection"], None]) -> "Connection":
        """Connect and authenticate within ``connect_timeout`` seconds.

        Raises:
            BackendConnectionError: the store cannot be reached or hung up during the handshake.
            BackendTimeoutError: the peer did not answer the handshake in time.
            BackendAuthError: the store rejected the token.
            ProtocolError: the peer is not an elastic-store, or speaks another protocol version.
        """
        deadline = time.monotonic() + connect_timeout
        try:
            sock = socket.create_connection((endpoint.host, endpoint.port), timeout=connect_timeout)
        except OSError as error:
            raise BackendConnectionError(
                f"Cannot connect to the elastic-store at {endpoint}: {dial_advice(error, connect_timeout)}."
            ) from error
        try:
            tune_socket(sock)
            hello, decoder = handshake(sock, endpoint, token, max_frame_bytes, deadline)
            sock.settimeout(None)  # blocking; reads and sends are bounded by SO_RCVTIMEO/SO_SNDTIMEO
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(request_timeout))
        except BaseException:
            sock.close()
            raise
        return cls(sock, endpoint, hello, decoder, ids, on_push, on_lost)

    @property
    def alive(self) -> bool:
        return self._lost is None

    def request(self, header: dict[str, Any], parts: Sequence[bytes] = (), *, timeout: float,
                request_id: int | None = None, on_reply: Callable[[Frame], None] | None = None) -> Frame:
        """Send a request and wait for its response frame (which may be an error frame).

        ``on_reply`` runs on the reading thread before any later frame is handled.

        Raises:
            BackendConnectionError: the connection is or got lost.
            BackendClosedError: the connection was closed by its owner.
            BackendTimeoutError: no response within ``timeout``; whether it applied is unknown.
        """
        deadline = time.monotonic() + timeout
        request_id = next(self._ids) if request_id is None else request_id
        call = _Call(on_reply, waiter=True)
        self._send(request_id, call, header, parts)
        while call.frame is None and call.error is None:
            if self._read_lock.acquire(False):
                try:
                    self._read_until(call, deadline)
                finally:
                    self._leave_reading()
            else:
                call.wake.acquire(timeout=max(deadline - time.monotonic(), 0.0))
                with self._lock:
                    call.signalled = False
            if call.frame is None and call.error is None and time.monotonic() >= deadline:
                self._abandon(request_id, call, header.get("op"), timeout)
        if call.error is not None:
            raise call.error
        return call.frame  # type: ignore[return-value]  # set whenever error is not

    def submit(self, header: dict[str, Any], *, request_id: int, on_reply: Callable[[Frame], None]) -> None:
        """Send a request without waiting; ``on_reply`` runs on a reading thread if it is answered.

        Raises:
            BackendConnectionError, BackendClosedError: the connection is lost or closed.
        """
        self._send(request_id, _Call(on_reply, waiter=False), header, ())

    def read_in_background(self) -> None:
        """Start the background reader (once), so pushes are read while no call is reading."""
        with self._lock:
            if self._background is not None or self._lost is not None:
                return
            self._background = threading.Thread(
                target=self._background_reads, name=f"elastic-store-client-{self.endpoint}", daemon=True)
        self._background.start()

    def close(self) -> None:
        """Fail pending requests with BackendClosedError and hang up. Idempotent."""
        self._lose(BackendClosedError("The TCP store client was closed."))

    def dispose(self, timeout: float = 1.0) -> None:
        """After the connection is lost or closed: wait for readers to leave and free the socket."""
        background = self._background
        if background is not None and background is not threading.current_thread():
            background.join(timeout)
        if self._read_lock.acquire(timeout=timeout):
            self._sock.close()
            self._read_lock.release()

    # -- sending -----------------------------------------------------------------------------
    def _send(self, request_id: int, call: _Call, header: dict[str, Any], parts: Sequence[bytes]) -> None:
        header["i"] = request_id
        data = encode_frame(header, parts)
        if len(data) - 4 > self.hello.max_frame_bytes:
            raise ValueTooLargeError(
                f"The {header.get('op')!r} request is {len(data)} bytes, over the store's "
                f"{self.hello.max_frame_bytes}-byte frame limit."
            )
        with self._lock:
            if self._lost is not None:
                raise _copy(self._lost)
            self._pending[request_id] = call
        try:
            with self._write_lock:
                self._sock.sendall(data)
        except OSError as error:  # the pending call fails with the connection
            self._lose(_connection_error(self.endpoint, f"sending failed: {error}", error))

    def _abandon(self, request_id: int, call: _Call, op: object, timeout: float) -> None:
        with self._lock:
            abandoned = self._pending.pop(request_id, None)
        if abandoned is not None:
            raise BackendTimeoutError(
                f"The elastic-store at {self.endpoint} did not answer {op!r} within {timeout}s; "
                "whether it applied is unknown."
            )
        while call.frame is None and call.error is None:  # being answered right now: take it
            call.wake.acquire()

    # -- reading -----------------------------------------------------------------------------
    def _read_until(self, call: _Call, deadline: float) -> None:
        """As the reader: read until ``call`` is answered or ``deadline`` passes."""
        while call.frame is None and call.error is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._bound_blocking_reads(remaining)
            self._pump(0)

    def _bound_blocking_reads(self, seconds: float) -> None:
        """Make a blocking read return within about ``seconds`` (SO_RCVTIMEO).

        The option is only changed when it would overshoot by more than the slack, or wake
        the reader over twice as often as needed, so a stream of requests with the same
        timeout costs no system call each.
        """
        current = self._receive_timeout
        if current - _RECEIVE_TIMEOUT_SLACK <= seconds <= 2 * current:
            return
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(seconds))
        self._receive_timeout = seconds

    def _background_reads(self) -> None:
        poller = select.poll()
        try:
            poller.register(self._sock.fileno(), select.POLLIN)
        except (OSError, ValueError):
            return  # closed before this thread got going
        while self._lost is None:
            poller.poll()
            with self._read_lock:
                while self._lost is None and self._pump(socket.MSG_DONTWAIT):
                    pass
            self._promote_a_waiter()

    def _pump(self, flags: int) -> bool:
        """As the reader: one read, then dispatch what it completed; False if nothing came."""
        try:
            size = self._sock.recv_into(self._buffer, 0, flags)
            if not size:
                raise _PeerClosed("the store closed the connection")
            for frame in self._decoder.feed(self._buffer[:size]):
                self._dispatch(frame)
            return True
        except BlockingIOError:
            return False  # no data yet (non-blocking read, or the receive timeout passed)
        except (OSError, ProtocolError) as error:
            self._lose(_connection_error(self.endpoint, str(error), error))
            return False

    def _dispatch(self, frame: Frame) -> None:
        request_id = frame.header.get("i")
        if request_id is None and "err" in frame.header and "w" not in frame.header:
            self._lose(_refusal(self.endpoint, frame.header))  # the store says why it hangs up
            return
        if request_id is None:
            try:
                self._on_push(frame)
            except ProtocolError:
                raise  # a malformed push: the connection is dropped
            except Exception:  # a handler bug must not kill the connection
                log.exception("elastic-store client %s: a watch push handler failed", self.endpoint)
            return
        with self._lock:
            call = self._pending.pop(request_id, None)
            if call is not None and call.on_reply is None:
                call.frame = frame
                _signal(call)
                return
        if call is None:
            return  # abandoned after a timeout, or an answer nobody waits for
        try:
            call.on_reply(frame)  # type: ignore[misc]  # checked above
        except Exception:  # a callback bug must not kill the connection
            log.exception("elastic-store client %s: a reply callback failed", self.endpoint)
        with self._lock:
            call.frame = frame
            _signal(call)

    def _leave_reading(self) -> None:
        self._read_lock.release()
        self._promote_a_waiter()

    def _promote_a_waiter(self) -> None:
        """Wake one waiting caller so it takes over reading for its own answer."""
        if not self._pending:
            return  # a call registered after this check finds the socket free and reads itself
        with self._lock:
            for call in self._pending.values():
                if call.waiter and not call.signalled:
                    _signal(call)
                    return

    def _lose(self, error: BackendError) -> None:
        with self._lock:
            if self._lost is not None:
                return
            self._lost = error
            calls, self._pending = self._pending, {}
            for call in calls.values():
                call.error = _copy(error)
                _signal(call)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already disconnected
        if not isinstance(error, BackendClosedError):
            log.info("elastic-store client %s: connection lost: %s", self.endpoint, error)
        self._on_lost(self)


class _PeerClosed(OSError):
    """The peer closed the connection (EOF)."""


def _signal(call: _Call) -> None:
    """Wake the call's waiter (hold the connection lock)."""
    if not call.signalled:
        call.signalled = True
        call.wake.release()


def _copy(error: BackendError) -> BackendError:
    """A fresh instance of ``error`` (same type, message and cause) to raise in another thread."""
    copy = type(error)(str(error))
    copy.__cause__ = error.__cause__
    return copy


def _timeval(seconds: float) -> bytes:
    seconds = max(seconds, 0.001)
    return struct.pack("ll", int(seconds), int(seconds % 1 * 1_000_000))


def _refusal(endpoint: Endpoint, header: dict[str, Any]) -> BackendError:
    """The error a store's parting error frame describes, for every call still pending."""
    error = error_from_wire(header)
    if isinstance(error, BackendError) and not isinstance(error, CompactedError):  # _copy can rebuild it
        return error
    return ProtocolError(f"The elastic-store at {endpoint} hung up: {error}")


def _connection_error(endpoint: Endpoint, reason: str, cause: BaseException) -> BackendConnectionError:
    error = BackendConnectionError(f"Lost the connection to the elastic-store at {endpoint}: {reason}.")
    error.__cause__ = cause
    return error
