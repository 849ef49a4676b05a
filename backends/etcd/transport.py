"""A gRPC client for etcd over its own HTTP/2 connection: the built-in transport.

Why: grpcio's Python layer costs about 0.25 ms of client CPU per unary call and about 0.2 ms
per watch-stream message (a call crosses 3-4 threads: the caller, grpcio's per-stream request
thread, its channel "spin" thread and the consumer), measured on a 2-core machine; a rendezvous
node spends most of its CPU there. This transport does the same calls with one reader thread
per connection and the caller's own thread: a unary call is one ``sendall`` by the caller and
one wake-up by the reader. etcd's API needs only what gRPC calls unary and bidirectional
streaming calls, without compression, so the protocol surface is small: HTTP/2 frames, HPACK
(decoded by the ``hpack`` library) and flow control.

The objects here mimic the part of ``grpc.Channel`` the generated etcd stubs and our backend
use (``unary_unary``, ``stream_stream``, errors that are ``grpc.RpcError`` with ``code()`` and
``details()``), so the backend's failover, auth, watch and keepalive logic is the same on both
transports. ``EtcdConfig(transport="grpcio")`` switches back to grpcio.

Failure semantics, as grpcio's:
- a call made while no connection can be set up fails with UNAVAILABLE and details starting
  "failed to connect to all addresses" (nothing was sent, so even writes may be resent);
- a connection lost while calls are in flight fails them with UNAVAILABLE (outcome unknown);
- a call past its deadline is reset and fails with DEADLINE_EXCEEDED;
- a cancelled stream fails its reader with CANCELLED;
- after 10 s without any frame while calls are open the connection is pinged, and dropped when
  no answer comes within 5 s (a silently dead peer under a long-lived watch); see ``_watchdog``.
"""

from __future__ import annotations

import logging
import queue
import socket
import ssl
import threading
import time
from typing import Any, Callable, Iterable

import grpc

from backends.endpoints import Endpoint
from backends.etcd import wire
from backends.etcd.wire import ErrorCode, FrameType, Setting, WireError

log = logging.getLogger(__name__)

_CODES = {code.value[0]: code for code in grpc.StatusCode}
_OK = grpc.StatusCode.OK
(_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PUSH_PROMISE, _PING, _GOAWAY, _WINDOW_UPDATE, _CONTINUATION) = (
    int(kind) for kind in (FrameType.DATA, FrameType.HEADERS, FrameType.RST_STREAM, FrameType.SETTINGS,
                           FrameType.PUSH_PROMISE, FrameType.PING, FrameType.GOAWAY, FrameType.WINDOW_UPDATE,
                           FrameType.CONTINUATION)
)
_NOT_SENT = "failed to connect to all addresses"  # = translate.NOT_CONNECTED_PREFIX (grpcio's wording)
_WINDOW_REFILL = 1 << 30
"""Received bytes after which a stream's or the connection's receive window is topped up."""
_RECV_BYTES = 262_144
_RETRY_CONNECT_AFTER = 0.1
"""A failed connect is reported again, without dialing, to calls made within this many seconds."""


class CallError(grpc.RpcError):
    """A failed call: a ``grpc.RpcError`` with grpcio's ``code()`` and ``details()``."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class ConnectFailure(Exception):
    """A connection could not be set up. ``timed_out``: nothing answered in time."""

    def __init__(self, reason: str, *, timed_out: bool = False) -> None:
        super().__init__(reason)
        self.timed_out = timed_out


class RequestQueue:
    """The requests of one client stream, in order; ``put(None)`` ends the stream (half-close).

    grpcio iterates it from its request thread; the built-in transport attaches a writer, after
    which ``put`` sends at once from the caller's thread.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._writer: Callable[[Any], None] | None = None

    def put(self, request: Any) -> None:
        with self._lock:
            writer = self._writer
            if writer is None:
                self._queue.put(request)
                return
        writer(request)

    def attach(self, writer: Callable[[Any], None]) -> None:
        """Send what was queued, then send every later request directly with ``writer``."""
        with self._lock:
            while True:
                try:
                    writer(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._writer = writer

    def __iter__(self) -> "RequestQueue":
        return self

    def __next__(self) -> Any:
        request = self._queue.get()
        if request is None:
            raise StopIteration
        return request


# -- the byte pipes ----------------------------------------------------------------------------
class _PlainWire:
    """A TCP socket. ``send`` is called under the connection's send lock; ``recv`` by the reader."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> bytes:
        return self.sock.recv(_RECV_BYTES)

    def close(self) -> None:
        _close_socket(self.sock)


class _TlsWire:
    """TLS over a TCP socket through memory BIOs, so one thread may read while another writes
    (an ``ssl.SSLSocket`` must not be read and written concurrently)."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, hostname: str, deadline: float) -> None:
        self.sock = sock
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_hostname=hostname)
        self._lock = threading.Lock()  # the SSL object; taken inside the connection's send lock
        self._send_lock = threading.Lock()  # records leave in the order they were made
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                data = sock.recv(_RECV_BYTES)
                if not data:
                    raise ConnectionResetError("the server closed the connection during the TLS handshake (socket closed)")
                self._incoming.write(data)
        self._flush()

    def _flush(self) -> None:
        with self._send_lock:
            with self._lock:
                data = self._outgoing.read()
            if data:
                self.sock.sendall(data)

    def send(self, data: bytes) -> None:
        with self._send_lock:
            with self._lock:
                self._tls.write(data)
                encrypted = self._outgoing.read()
            self.sock.sendall(encrypted)

    def recv(self) -> bytes:
        while True:
            data = self.sock.recv(_RECV_BYTES)
            if not data:
                return b""
            chunks: list[bytes] = []
            with self._lock:
                self._incoming.write(data)
                try:
                    while True:
                        chunks.append(self._tls.read(_RECV_BYTES))
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLZeroReturnError:
                    return b"".join(chunks)
                pending = self._outgoing.pending
            if pending:
                self._flush()
            if chunks:
                return b"".join(chunks)

    def close(self) -> None:
        _close_socket(self.sock)


def _close_socket(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


# -- calls -------------------------------------------------------------------------------------
class _Stream:
    """One call on a connection: its windows, its partial messages and how it ends."""

    __slots__ = ("id", "deserialize", "assembler", "headers", "send_window", "received", "messages",
                 "done", "code", "details", "streaming", "local_end", "outbox", "end_pending", "listener", "on_end")

    def __init__(self, deserialize: Callable[[bytes], Any], streaming: bool) -> None:
        self.id = 0  # id and send window are set when the connection opens the stream
        self.deserialize = deserialize
        self.assembler = wire.MessageAssembler()
        self.headers: dict[str, str] | None = None
        self.send_window = 0
        self.received = 0
        self.streaming = streaming
        self.messages: Any = queue.SimpleQueue() if streaming else []
        self.done = threading.Lock()
        self.done.acquire()  # released when the call ends
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.local_end = False  # we sent END_STREAM
        self.outbox = bytearray()  # request bytes waiting for flow-control window
        self.end_pending = False  # END_STREAM goes out once the outbox is empty
        self.listener: Callable[[Any], None] | None = None  # gets each response on the reader thread
        self.on_end: Callable[[], None] | None = None  # told when the call ends (see StreamCall.listen)

    def finish(self, code: grpc.StatusCode, details: str) -> bool:
        """Record the call's end once; False if it had already ended."""
        if self.code is not None:
            return False
        self.code = code
        self.details = details
        if self.streaming:
            self.messages.put(_END)
        self.done.release()
        if self.on_end is not None:
            self.on_end()
        return True


_END = object()


class H2Connection:
    """One HTTP/2 connection to one etcd endpoint, read by one thread.

    Raises (from the constructor):
        ConnectFailure: no TCP connection, a failed TLS handshake, or no HTTP/2 greeting in time.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        tls: ssl.SSLContext | None,
        timeout: float,
        *,
        keepalive_time: float = 10.0,
        keepalive_timeout: float = 5.0,
    ) -> None:
        self.endpoint = endpoint
        self._authority = endpoint.netloc
        self._scheme = "https" if tls is not None else "http"
        self._keepalive_time = keepalive_time
        self._keepalive_timeout = keepalive_timeout
        self._send_lock = threading.RLock()
        self._streams: dict[int, _Stream] = {}
        self._blocked: set[_Stream] = set()  # streams with request bytes waiting for window
        self._next_id = 1
        self._send_window = wire.DEFAULT_WINDOW
        self._initial_stream_window = wire.DEFAULT_WINDOW
        self._max_frame = wire.DEFAULT_MAX_FRAME
        self._received = 0
        self._decoder = wire.HeaderDecoder()
        self._header_cache: dict[tuple[str, tuple], bytes] = {}  # request header blocks without grpc-timeout
        self._pending_headers: tuple[int, int, bytearray] | None = None
        self._ping_sent_at: float | None = None
        self._last_frame_at = time.monotonic()
        self._stopped = threading.Event()
        self.error: str | None = None  # why the connection ended; None while usable
        self.going_away = False
        deadline = time.monotonic() + timeout
        self._wire, leftover = self._connect(tls, deadline)
        self._buffer = bytearray(leftover)
        self._reader = threading.Thread(target=self._read_loop, name=f"etcd-h2 {endpoint.netloc}", daemon=True)
        self._reader.start()
        self._watchdog_thread = threading.Thread(target=self._watchdog, name=f"etcd-h2 ping {endpoint.netloc}",
                                                 daemon=True)
        self._watchdog_thread.start()

    # -- setup ---------------------------------------------------------------------------------
    def _connect(self, tls: ssl.SSLContext | None, deadline: float) -> tuple[Any, bytes]:
        host, port = self.endpoint.host, self.endpoint.port
        try:
            sock = socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.001))
        except socket.timeout as error:
            raise ConnectFailure("the TCP connection timed out", timed_out=True) from error
        except socket.gaierror as error:
            raise ConnectFailure(f"DNS resolution of {host!r} failed: {error.strerror}") from error
        except OSError as error:
            raise ConnectFailure(str(error)) from error
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pipe: Any
            if tls is not None:
                try:
                    pipe = _TlsWire(sock, tls, self.endpoint.host, deadline)
                except ssl.SSLCertVerificationError as error:
                    raise ConnectFailure(f"TLS handshake failed: certificate verify failed: {error.verify_message}") from error
                except ssl.SSLError as error:
                    raise ConnectFailure(f"TLS handshake failed: {error.reason or error}") from error
            else:
                pipe = _PlainWire(sock)
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            pipe.send(
                wire.PREFACE
                + wire.settings_frame({Setting.ENABLE_PUSH: 0, Setting.INITIAL_WINDOW_SIZE: wire.MAX_WINDOW})
                + wire.window_update_frame(0, wire.MAX_WINDOW - wire.DEFAULT_WINDOW)
            )
            greeting = self._read_greeting(pipe)
        except ConnectFailure:
            _close_socket(sock)
            raise
        except socket.timeout as error:
            _close_socket(sock)
            raise ConnectFailure("the server accepted the connection but sent no HTTP/2 settings frame in time",
                                 timed_out=True) from error
        except OSError as error:
            _close_socket(sock)
            raise ConnectFailure(f"socket closed during setup ({error})") from error
        payload, leftover = greeting
        self._apply_settings(wire.parse_settings(payload))
        pipe.send(wire.frame(FrameType.SETTINGS, wire.ACK, 0))
        sock.settimeout(None)  # blocking from now on; the watchdog detects a dead peer
        return pipe, leftover

    @staticmethod
    def _read_greeting(pipe: Any) -> tuple[bytes, bytes]:
        """The payload of the server's first frame (its SETTINGS) and the bytes that followed it."""
        data = b""
        while len(data) < wire.FRAME_HEADER_BYTES or len(data) < wire.FRAME_HEADER_BYTES + int.from_bytes(data[:3], "big"):
            chunk = pipe.recv()
            if not chunk:
                if data:
                    raise ConnectFailure(f"the server does not speak HTTP/2: it sent {data[:40]!r} and closed")
                raise ConnectFailure("socket closed by the server during setup, before its first frame")
            data += chunk
            if len(data) >= wire.FRAME_HEADER_BYTES and (data[3] != FrameType.SETTINGS or data[4] & wire.ACK
                                                          or int.from_bytes(data[:3], "big") > 1024):
                raise ConnectFailure(f"the server does not speak HTTP/2: it answered {data[:40]!r}")
        length = int.from_bytes(data[:3], "big")
        end = wire.FRAME_HEADER_BYTES + length
        return data[wire.FRAME_HEADER_BYTES:end], data[end:]

    # -- calls ---------------------------------------------------------------------------------
    @property
    def usable(self) -> bool:
        return self.error is None and not self.going_away

    @property
    def open_calls(self) -> int:
        return len(self._streams)

    def start(self, path: str, metadata: Iterable[tuple[str, str]], timeout: float | None,
              deserialize: Callable[[bytes], Any], body: bytes | None) -> _Stream:
        """Open a call: send its headers and, for a unary call (``body`` given), its request.

        Raises:
            CallError: UNAVAILABLE "failed to connect..." when the connection is gone (not sent).
        """
        stream = _Stream(deserialize, body is None)
        metadata = tuple(metadata)
        key = (path, metadata)
        block = self._header_cache.get(key)
        if block is None:
            block = wire.request_headers(path, self._authority, self._scheme, None, metadata)
            if len(self._header_cache) < 256:
                self._header_cache[key] = block
        if timeout is not None:
            block += wire.timeout_field(timeout)
        with self._send_lock:
            if not self.usable:
                raise CallError(grpc.StatusCode.UNAVAILABLE,
                                f"{_NOT_SENT}; the connection to {self._authority} ended before the request was sent "
                                f"({self.error or 'the server is going away'})")
            stream.id = self._next_id
            self._next_id += 2
            if self._next_id > 2**31 - 1:
                self.going_away = True  # stream ids exhausted: the next call opens a new connection
            stream.send_window = self._initial_stream_window
            self._streams[stream.id] = stream
            headers = wire.header_frames(stream.id, block, self._max_frame)
            if body is None:
                self._write(headers)
            else:
                stream.outbox += wire.grpc_message(body)
                stream.end_pending = True
                self._flush(stream, headers)
        return stream

    def send_message(self, stream: _Stream, body: bytes | None, *, end: bool = False) -> None:
        """Queue one request message on ``stream`` (None: only end the stream) and send what flow
        control allows now; the rest goes when the server opens its window. Never blocks on the
        window, so a caller holding its own locks cannot deadlock with the reader thread.
        A stream that already ended ignores it (its reader sees why).
        """
        with self._send_lock:
            if stream.end_pending or stream.code is not None or self.error is not None:
                return
            if body is not None:
                stream.outbox += wire.grpc_message(body)
            stream.end_pending = end
            self._flush(stream)

    def _flush(self, stream: _Stream, prefix: bytes = b"") -> None:
        """Send ``prefix`` and as much of ``stream``'s outbox as the windows allow (under _send_lock)."""
        outbox = stream.outbox
        size = len(outbox)
        if 0 < size <= self._max_frame and size <= self._send_window and size <= stream.send_window:
            # The common case: the whole outbox in one DATA frame.
            self._send_window -= size
            stream.send_window -= size
            last = stream.end_pending
            stream.local_end = stream.local_end or last
            data = wire.frame(_DATA, wire.END_STREAM if last else 0, stream.id, bytes(outbox))
            outbox.clear()
            self._blocked.discard(stream)
            self._write(prefix + data if prefix else data)
            return
        frames = [prefix] if prefix else []
        while outbox:
            room = min(self._send_window, stream.send_window, self._max_frame)
            if room <= 0:
                self._blocked.add(stream)
                break
            chunk = bytes(outbox[:room])
            del outbox[:room]
            self._send_window -= len(chunk)
            stream.send_window -= len(chunk)
            last = stream.end_pending and not outbox
            frames.append(wire.frame(_DATA, wire.END_STREAM if last else 0, stream.id, chunk))
            stream.local_end = stream.local_end or last
        else:
            self._blocked.discard(stream)
            if stream.end_pending and not stream.local_end:
                frames.append(wire.frame(_DATA, wire.END_STREAM, stream.id))
                stream.local_end = True
        if frames:
            self._write(b"".join(frames))

    def _flush_blocked(self) -> None:
        """Windows opened: send what waited (under _send_lock)."""
        for stream in list(self._blocked):
            if stream.code is not None:
                self._blocked.discard(stream)
            else:
                self._flush(stream)

    def reset(self, stream: _Stream, code: grpc.StatusCode, details: str) -> None:
        """End ``stream`` locally (cancel or deadline) and tell the server."""
        with self._send_lock:
            if not stream.finish(code, details):
                return
            self._streams.pop(stream.id, None)
            self._blocked.discard(stream)
            if self.error is None:
                try:
                    self._write(wire.rst_stream_frame(stream.id, ErrorCode.CANCEL))
                except CallError:
                    pass
            self._close_if_drained()

    def close(self, reason: str, code: grpc.StatusCode = grpc.StatusCode.CANCELLED) -> None:
        """End the connection and every call on it with ``code``."""
        self._fail(reason, code)

    # -- writing (under _send_lock) --------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        try:
            self._wire.send(data)
        except OSError as error:
            self._fail_locked(f"sending failed: {error}", grpc.StatusCode.UNAVAILABLE)
            raise CallError(grpc.StatusCode.UNAVAILABLE, f"the connection to {self._authority} broke: {error}") from error

    # -- the reader thread -----------------------------------------------------------------------
    def _read_loop(self) -> None:
        try:
            self._on_bytes(b"")  # frames that came with the server's settings
            while True:
                chunk = self._wire.recv()
                self._last_frame_at = time.monotonic()
                if not chunk:
                    raise ConnectionResetError("the server closed the connection")
                self._on_bytes(chunk)
        except (OSError, WireError, ssl.SSLError, ValueError) as error:
            self._fail(f"connection to {self._authority} lost: {error}", grpc.StatusCode.UNAVAILABLE)
        except CallError:
            pass  # our own write failed (answering a PING or SETTINGS): _write failed every call already
        except Exception as error:  # a bug must not leave calls waiting forever
            log.exception("etcd HTTP/2 reader on %s: internal error", self._authority)
            self._fail(f"internal error on the connection to {self._authority}: {error!r}", grpc.StatusCode.INTERNAL)

    def _watchdog(self) -> None:
        """Every few seconds: ping after ``keepalive_time`` without a frame while calls are open,
        and drop the connection when a ping goes unanswered for ``keepalive_timeout``.

        A thread of its own so that the reader can block in ``recv`` without a socket timeout
        (a timeout makes every ``recv`` and ``send`` a poll plus the call).
        """
        period = min(self._keepalive_time, self._keepalive_timeout) / 2
        while not self._stopped.wait(period):
            now = time.monotonic()
            if self._ping_sent_at is not None:
                if now - self._ping_sent_at >= self._keepalive_timeout:
                    self._fail(f"connection to {self._authority} lost: no answer to a keepalive ping within "
                               f"{self._keepalive_timeout:g}s", grpc.StatusCode.UNAVAILABLE)
                    return
            elif self._streams and now - self._last_frame_at >= self._keepalive_time:
                self.probe()

    def probe(self) -> None:
        """Ping the server unless a ping is out already; the watchdog drops the connection when
        no answer comes within ``keepalive_timeout``. Called when a call timed out, so that a
        silently dead connection is not reused by the retries."""
        with self._send_lock:
            if self.error is not None or self._ping_sent_at is not None:
                return
            self._ping_sent_at = time.monotonic()
            try:
                self._write(wire.frame(FrameType.PING, 0, 0, b"etcdping"))
            except CallError:
                pass  # the connection is failed now

    def _on_bytes(self, chunk: bytes) -> None:
        buffer = self._buffer
        buffer += chunk
        position = 0
        size = len(buffer)
        while size - position >= 9:
            length = int.from_bytes(buffer[position : position + 3], "big")
            end = position + 9 + length
            if end > size:
                break
            kind = buffer[position + 3]
            flags = buffer[position + 4]
            stream_id = int.from_bytes(buffer[position + 5 : position + 9], "big") & 0x7FFF_FFFF
            payload = bytes(buffer[position + 9 : end])
            position = end
            self._on_frame(kind, flags, stream_id, payload)
        if position:
            del buffer[:position]

    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._pending_headers is not None and kind != _CONTINUATION:
            raise WireError("a header block was interrupted by another frame")
        if kind == _DATA:
            self._on_data(stream_id, flags, payload)
        elif kind == _HEADERS:
            fragment = wire.header_fragment(payload, flags)
            if flags & wire.END_HEADERS:
                self._on_headers(stream_id, flags, fragment)
            else:
                self._pending_headers = (stream_id, flags, bytearray(fragment))
        elif kind == _CONTINUATION:
            if self._pending_headers is None or self._pending_headers[0] != stream_id:
                raise WireError("a CONTINUATION frame without its HEADERS")
            self._pending_headers[2].extend(payload)
            if flags & wire.END_HEADERS:
                pending, self._pending_headers = self._pending_headers, None
                self._on_headers(pending[0], pending[1], bytes(pending[2]))
        elif kind == _RST_STREAM:
            code = wire.parse_u32(payload, "RST_STREAM")
            name = ErrorCode(code).name if code in ErrorCode._value2member_map_ else str(code)
            self._end(stream_id, _CODES[wire.RST_TO_GRPC.get(code, 13)], f"the server reset the stream ({name})")
        elif kind == _SETTINGS:
            if not flags & wire.ACK:
                self._apply_settings(wire.parse_settings(payload))
                with self._send_lock:
                    self._write(wire.frame(FrameType.SETTINGS, wire.ACK, 0))
        elif kind == _PING:
            if flags & wire.ACK:
                self._ping_sent_at = None
            else:
                with self._send_lock:
                    self._write(wire.frame(FrameType.PING, wire.ACK, 0, payload))
        elif kind == _GOAWAY:
            self._on_goaway(*wire.parse_goaway(payload))
        elif kind == _WINDOW_UPDATE:
            increment = wire.parse_u32(payload, "WINDOW_UPDATE")
            with self._send_lock:
                if stream_id == 0:
                    self._send_window += increment
                elif (stream := self._streams.get(stream_id)) is not None:
                    stream.send_window += increment
                if self._blocked:
                    self._flush_blocked()
        elif kind == _PUSH_PROMISE:
            raise WireError("the server pushed a stream though push is disabled")
        # PRIORITY and unknown frame types are ignored (RFC 9113 §4.1, §5.5).

    def _on_data(self, stream_id: int, flags: int, payload: bytes) -> None:
        self._received += len(payload)
        stream = self._streams.get(stream_id)
        refill = b""
        if self._received >= _WINDOW_REFILL:
            refill += wire.window_update_frame(0, self._received)
            self._received = 0
        if stream is not None:
            stream.received += len(payload)
            if stream.received >= _WINDOW_REFILL:
                refill += wire.window_update_frame(stream_id, stream.received)
                stream.received = 0
        if refill:
            with self._send_lock:
                self._write(refill)
        if stream is None:
            return
        messages = stream.assembler.feed(wire.strip_padding(payload, flags))
        if messages:
            if not stream.streaming:
                stream.messages.extend(messages)
            elif stream.listener is not None:
                for message in messages:
                    if stream.code is None:
                        stream.listener(stream.deserialize(message))
            else:
                for message in messages:
                    stream.messages.put(stream.deserialize(message))
        if flags & wire.END_STREAM:
            self._end(stream_id, grpc.StatusCode.INTERNAL, "the server ended the call without a gRPC status")

    def _on_headers(self, stream_id: int, flags: int, block: bytes) -> None:
        fields = self._decoder.decode(block)  # always: the decoder's table must follow every block
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        if stream.headers is None:
            stream.headers = fields
            if fields.get(":status") != "200" and not flags & wire.END_STREAM:
                code, details = wire.call_status(fields, None)
                self._end(stream_id, _CODES.get(code, grpc.StatusCode.UNKNOWN), details)
                self._reset_quietly(stream_id)
                return
            if not flags & wire.END_STREAM:
                return
            trailers = None  # trailers-only response: the headers carry the status
        else:
            trailers = fields
            if trailers.get("grpc-status") == "0" and stream.headers.get(":status") == "200" \
                    and not stream.assembler.pending:
                self._end(stream_id, _OK, "")  # the common case, without call_status's merging
                return
        code, details = wire.call_status(stream.headers, trailers)
        if code == 0 and stream.assembler.pending:
            code, details = 13, "the call ended inside a message"
        self._end(stream_id, _CODES.get(code, grpc.StatusCode.UNKNOWN), details)

    def _reset_quietly(self, stream_id: int) -> None:
        with self._send_lock:
            if self.error is None:
                self._write(wire.rst_stream_frame(stream_id, ErrorCode.CANCEL))

    def _on_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        name = ErrorCode(code).name if code in ErrorCode._value2member_map_ else str(code)
        reason = f"the server is going away (GOAWAY {name}{': ' + debug.decode(errors='replace') if debug else ''})"
        with self._send_lock:
            self.going_away = True
            unprocessed = [stream for stream_id, stream in self._streams.items() if stream_id > last_stream_id]
        for stream in unprocessed:
            self._end(stream.id, grpc.StatusCode.UNAVAILABLE, f"{_NOT_SENT}; {reason} and did not process the call")
        log.debug("etcd at %s: %s", self._authority, reason)
        with self._send_lock:
            self._close_if_drained()

    def _apply_settings(self, settings: dict[int, int]) -> None:
        with self._send_lock:
            if Setting.MAX_FRAME_SIZE in settings:
                self._max_frame = settings[Setting.MAX_FRAME_SIZE]
            if Setting.INITIAL_WINDOW_SIZE in settings:
                delta = settings[Setting.INITIAL_WINDOW_SIZE] - self._initial_stream_window
                self._initial_stream_window = settings[Setting.INITIAL_WINDOW_SIZE]
                for stream in self._streams.values():
                    stream.send_window += delta
                if self._blocked:
                    self._flush_blocked()

    def _end(self, stream_id: int, code: grpc.StatusCode, details: str) -> None:
        with self._send_lock:
            stream = self._streams.pop(stream_id, None)
            if stream is not None:
                stream.finish(code, details)
                self._blocked.discard(stream)
            if self.going_away:
                self._close_if_drained()

    def _close_if_drained(self) -> None:
        if self.going_away and not self._streams and self.error is None:
            self.error = "drained after the server went away"
            self._stopped.set()
            self._wire.close()

    def _fail(self, reason: str, code: grpc.StatusCode) -> None:
        with self._send_lock:
            self._fail_locked(reason, code)

    def _fail_locked(self, reason: str, code: grpc.StatusCode) -> None:
        first = self.error is None
        if first:
            self.error = reason
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.finish(code, reason)
        self._blocked.clear()
        if first:
            self._stopped.set()
            self._wire.close()


# -- the channel -------------------------------------------------------------------------------
class NativeChannel:
    """The part of ``grpc.Channel`` the etcd stubs use, over one :class:`H2Connection` at a time."""

    def __init__(self, endpoint: Endpoint, tls: ssl.SSLContext | None, *, dial_timeout: float) -> None:
        self.endpoint = endpoint
        self._tls = tls
        self._dial_timeout = dial_timeout
        self._lock = threading.Lock()
        self._connection: H2Connection | None = None
        self._last_failure: tuple[float, ConnectFailure] | None = None
        self._retired: list[H2Connection] = []  # replaced connections whose calls still run
        self._closed = False

    # grpc.Channel's factory methods, as the generated stubs call them
    def unary_unary(self, method: str, request_serializer: Callable | None = None,
                    response_deserializer: Callable | None = None, **_: Any) -> "_UnaryCallable":
        return _UnaryCallable(self, method, request_serializer, response_deserializer)

    def stream_stream(self, method: str, request_serializer: Callable | None = None,
                      response_deserializer: Callable | None = None, **_: Any) -> "_StreamCallable":
        return _StreamCallable(self, method, request_serializer, response_deserializer)

    @property
    def connected(self) -> bool:
        connection = self._connection
        return connection is not None and connection.usable

    @property
    def failed(self) -> bool:
        return self._last_failure is not None and not self.connected

    def dial(self, timeout: float) -> bool:
        """Connect now unless connected; False if nothing answered within ``timeout``.

        Any other failure is kept and reported by the next call (it fails at once with it).
        """
        try:
            self.connection(timeout, fresh=True)
        except ConnectFailure as failure:
            return not failure.timed_out
        except CallError:
            return True
        return True

    def connection(self, timeout: float | None, *, fresh: bool = False) -> H2Connection:
        """The live connection, set up now if needed.

        Raises:
            CallError: the channel is closed (CANCELLED), or connecting failed (UNAVAILABLE,
                "failed to connect to all addresses; <why>").
            ConnectFailure: only with ``fresh``: connecting failed.
        """
        connection = self._connection
        if connection is not None and connection.usable:
            return connection
        with self._lock:
            if self._closed:
                raise CallError(grpc.StatusCode.CANCELLED, "the channel was closed")
            connection = self._connection
            if connection is not None and connection.usable:
                return connection
            now = time.monotonic()
            if not fresh and self._last_failure is not None and now - self._last_failure[0] < _RETRY_CONNECT_AFTER:
                failure = self._last_failure[1]
            else:
                budget = self._dial_timeout if timeout is None else min(timeout, self._dial_timeout)
                try:
                    connection = H2Connection(self.endpoint, self._tls, max(budget, 0.001))
                except ConnectFailure as error:
                    self._last_failure = (time.monotonic(), error)
                    if fresh:
                        raise
                    failure = error
                else:
                    self._last_failure = None
                    old, self._connection = self._connection, connection
                    if old is not None:
                        if old.open_calls == 0:
                            old.close("replaced")
                        else:  # going away with calls still running: closed with the channel at the latest
                            self._retired = [retired for retired in self._retired if retired.error is None]
                            self._retired.append(old)
                    return connection
        raise CallError(grpc.StatusCode.UNAVAILABLE, f"{_NOT_SENT}; last error: {failure}")

    def close(self) -> None:
        """End the connection; calls in flight fail with CANCELLED and new ones are refused."""
        with self._lock:
            self._closed = True
            connections = [self._connection, *self._retired]
            self._connection, self._retired = None, []
        for connection in connections:
            if connection is not None:
                connection.close("the channel was closed")


class _Callable:
    """One RPC method of a :class:`NativeChannel`, as a generated stub holds it."""

    def __init__(self, channel: NativeChannel, method: str, serialize: Callable | None, deserialize: Callable | None) -> None:
        self._channel = channel
        self._method = method
        self._serialize = serialize or (lambda message: message)
        self._deserialize = deserialize or (lambda data: data)


class _UnaryCallable(_Callable):
    def __call__(self, request: Any, timeout: float | None = None, metadata: Iterable[tuple[str, str]] | None = None,
                 **_: Any) -> Any:
        """Send ``request`` and return the response. Raises CallError (a grpc.RpcError)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        connection = self._channel.connection(timeout)
        remaining = None if deadline is None else max(deadline - time.monotonic(), 0.001)
        stream = connection.start(self._method, metadata or (), remaining, self._deserialize,
                                  self._serialize(request))
        wait = -1 if deadline is None else max(deadline - time.monotonic(), 0.0)
        if not stream.done.acquire(timeout=wait):
            connection.reset(stream, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            connection.probe()
        if stream.code is not _OK:
            raise CallError(stream.code, stream.details)  # type: ignore[arg-type]
        if len(stream.messages) != 1:
            raise CallError(grpc.StatusCode.INTERNAL,
                            f"the server sent {len(stream.messages)} messages for a unary call {self._method}")
        return self._deserialize(stream.messages[0])


class _StreamCallable(_Callable):
    def __call__(self, requests: Iterable[Any], timeout: float | None = None,
                 metadata: Iterable[tuple[str, str]] | None = None, **_: Any) -> "StreamCall":
        """Open the call; ``requests`` is sent as it comes (directly, for a RequestQueue).

        Raises:
            CallError: connecting failed (UNAVAILABLE) or the channel is closed (CANCELLED).
        """
        connection = self._channel.connection(timeout)
        stream = connection.start(self._method, metadata or (), timeout, self._deserialize, None)
        call = StreamCall(connection, stream, self._serialize)
        if timeout is not None:  # enforced here too, as grpcio does (the server may never answer)
            expiry = threading.Timer(timeout, connection.reset,
                                     args=(stream, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
            expiry.daemon = True
            expiry.start()
        if isinstance(requests, RequestQueue):
            requests.attach(call.write)
        else:
            threading.Thread(target=call.write_all, args=(requests,), name=f"etcd-h2 send {self._method}",
                             daemon=True).start()
        return call


class StreamCall:
    """A bidirectional call: iterate it for responses; ``cancel()`` ends it (readers get CANCELLED)."""

    def __init__(self, connection: H2Connection, stream: _Stream, serialize: Callable[[Any], bytes]) -> None:
        self._connection = connection
        self._stream = stream
        self._serialize = serialize

    def write(self, request: Any) -> None:
        """Send one request; None ends our side of the stream. Ignored once the call ended."""
        if request is None:
            self._connection.send_message(self._stream, None, end=True)
        else:
            self._connection.send_message(self._stream, self._serialize(request))

    def write_all(self, requests: Iterable[Any]) -> None:
        try:
            for request in requests:
                if self._stream.code is not None:
                    return
                self.write(request)
            self.write(None)
        except Exception as error:  # the request iterator failed: end the call as grpcio does
            log.warning("etcd stream %d: the request iterator failed: %r", self._stream.id, error)
            self._connection.reset(self._stream, grpc.StatusCode.UNKNOWN, f"the request iterator raised {error!r}")

    def cancel(self) -> bool:
        self._connection.reset(self._stream, grpc.StatusCode.CANCELLED, "Locally cancelled")
        return True

    def listen(self, on_message: Callable[[Any], None], on_end: Callable[[], None] | None = None) -> None:
        """Hand every response to ``on_message`` on the connection's reader thread, instead of
        queueing it for iteration (one thread hand-off less per message). Call it before the
        first request is sent; ``on_message`` must not block (it may send on this connection).
        ``on_end`` is called once when the call ends, possibly under the connection's locks: it
        must only signal (say, set an Event). Use :meth:`wait_end` to learn how the call ended.
        """
        if not self._stream.messages.empty():
            raise RuntimeError("listen() after responses arrived; call it before sending the first request")
        self._stream.on_end = on_end
        self._stream.listener = on_message

    def wait_end(self, timeout: float | None = None) -> bool:
        """Block until the call ends (False at ``timeout``); returns True for a clean end.

        Raises:
            CallError: the call failed, or was cancelled (CANCELLED).
        """
        if not self._stream.done.acquire(timeout=-1 if timeout is None else timeout):
            return False
        self._stream.done.release()  # stays open for every other waiter
        if self._stream.code is not _OK:
            raise CallError(self._stream.code, self._stream.details)  # type: ignore[arg-type]
        return True

    @property
    def ended(self) -> bool:
        return self._stream.code is not None

    def __iter__(self) -> "StreamCall":
        return self

    def __next__(self) -> Any:
        item = self._stream.messages.get()
        if item is _END:
            self._stream.messages.put(_END)  # later calls see the end too
            if self._stream.code is grpc.StatusCode.OK:
                raise StopIteration
            raise CallError(self._stream.code, self._stream.details)  # type: ignore[arg-type]
        return item


def tls_context(ca_cert: str | None, client_cert: str | None, client_key: str | None) -> ssl.SSLContext:
    """A client TLS context: the CA (or the system roots), an optional client certificate, ALPN h2.

    Raises:
        ssl.SSLError, OSError: a certificate or key file cannot be loaded.
    """
    context = ssl.create_default_context(cafile=ca_cert) if ca_cert else ssl.create_default_context()
    if client_cert:
        context.load_cert_chain(client_cert, client_key)
    context.set_alpn_protocols(["h2"])
    return context
