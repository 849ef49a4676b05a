"""The built-in etcd transport (backends.etcd.transport) against a scripted HTTP/2 server.

The server here is a few dozen lines of HTTP/2 written for the tests: a thread per accepted
connection on 127.0.0.1 that reads the client's preface and SETTINGS, sends its own SETTINGS,
ACKs the client's, and then runs the test's script (read requests, answer, reset, go away,
close, ...). Header blocks it sends are made by ``hpack.Encoder``; it decodes the client's with
``hpack.Decoder``. Every wait is bounded by ``WAIT``; the ``h2`` fixture closes every channel,
connection and server a test made, and fails the test if a server script raised or a transport
thread outlived it.
"""

from __future__ import annotations

import re
import socket
import ssl
import struct
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import grpc
import hpack
import pytest
from etcd3.etcdrpc import RangeRequest, RangeResponse, WatchCreateRequest, WatchRequest, WatchResponse
from etcd3.etcdrpc.kv_pb2 import KeyValue

from backends.endpoints import Endpoint
from backends.etcd import transport
from backends.etcd.transport import CallError, H2Connection, NativeChannel, RequestQueue, tls_context
from backends.etcd.wire import ErrorCode, Setting
from elastic.testing.tls import make_tls_files

pytestmark = pytest.mark.timeout(30)

WAIT = 3.0
"""The bound of every wait in this file, in seconds."""
NOT_SENT = "failed to connect to all addresses"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
MAX_WINDOW = 2**31 - 1
RESPONSE_HEADERS = [(":status", "200"), ("content-type", "application/grpc")]


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream_id) + payload


def grpc_message(body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(body)) + body


# -- the scripted server -----------------------------------------------------------------------
class Frame(NamedTuple):
    kind: int
    flags: int
    stream_id: int
    payload: bytes


class ClientClosed(Exception):
    """The client closed the connection (a script ends cleanly on it)."""


@dataclass
class ClientStream:
    """What the server received on one stream the client opened."""

    id: int
    fields: list[tuple[str, str]]
    body: bytearray = field(default_factory=bytearray)
    data_frames: list[tuple[int, int]] = field(default_factory=list)  # (length, flags) of each DATA frame
    messages: list[bytes] = field(default_factory=list)
    ended: bool = False  # END_STREAM received (the client half-closed)
    reset: int | None = None  # the client's RST_STREAM error code
    _offset: int = 0

    @property
    def headers(self) -> dict[str, str]:
        return dict(self.fields)

    def add_data(self, payload: bytes, flags: int) -> None:
        self.data_frames.append((len(payload), flags))
        self.body += payload
        while len(self.body) - self._offset >= 5:
            length = int.from_bytes(self.body[self._offset + 1 : self._offset + 5], "big")
            end = self._offset + 5 + length
            if len(self.body) < end:
                break
            self.messages.append(bytes(self.body[self._offset + 5 : end]))
            self._offset = end
        if flags & END_STREAM:
            self.ended = True


class Peer:
    """The server's end of one client connection. Only its script's thread reads and writes it."""

    def __init__(self, sock: socket.socket, index: int) -> None:
        self.sock = sock
        self.index = index
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.frames: list[Frame] = []
        self.streams: dict[int, ClientStream] = {}
        self.client_settings: dict[int, int] | None = None
        self.settings_acks = 0
        self.pings: list[bytes] = []  # payloads of the client's PINGs
        self.ping_acks: list[bytes] = []  # payloads of the client's PING ACKs
        self.window_updates: list[tuple[int, int]] = []
        self.answer_pings = False
        self.closed = threading.Event()  # the client closed the connection
        self._buffer = bytearray()
        self._block: tuple[int, int, bytearray] | None = None
        self._handed_out: set[int] = set()

    # reading
    def _recv(self, timeout: float) -> bytes | None:
        """Bytes from the client; None at ``timeout``. Raises ClientClosed at EOF."""
        if self.closed.is_set():
            raise ClientClosed()
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data = self.sock.recv(65_536)
        except socket.timeout:
            return None
        except (ConnectionResetError, ssl.SSLError):
            data = b""
        if not data:
            self.closed.set()
            raise ClientClosed()
        return data

    def read_exact(self, count: int, timeout: float = WAIT) -> bytes:
        deadline = time.monotonic() + timeout
        while len(self._buffer) < count:
            data = self._recv(deadline - time.monotonic())
            if data is None:
                raise AssertionError(f"connection {self.index}: {count} bytes did not come in time")
            self._buffer += data
        out = bytes(self._buffer[:count])
        del self._buffer[:count]
        return out

    def pump(self, timeout: float) -> bool:
        """Read and record one frame; False if none came within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self._buffer) >= 9:
                end = 9 + int.from_bytes(self._buffer[:3], "big")
                if len(self._buffer) >= end:
                    head, payload = bytes(self._buffer[:9]), bytes(self._buffer[9:end])
                    del self._buffer[:end]
                    self._absorb(Frame(head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFF_FFFF, payload))
                    return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            data = self._recv(remaining)
            if data is None:
                return False
            self._buffer += data

    def wait_until(self, condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"connection {self.index}: timed out waiting for {what}")
            self.pump(remaining)

    def idle(self, seconds: float) -> None:
        """Record whatever the client sends for ``seconds``."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            self.pump(remaining)

    def wait_closed(self, timeout: float = WAIT) -> None:
        """Record frames until the client closes the connection."""
        try:
            self.wait_until(lambda: False, "the client to close the connection", timeout)
        except ClientClosed:
            pass

    def drain_until_closed(self, timeout: float = WAIT) -> None:
        """Read raw bytes (no framing) until the client closes the connection."""
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                self._recv(deadline - time.monotonic())
        except ClientClosed:
            return
        raise AssertionError(f"connection {self.index}: the client did not close the connection")

    def next_stream(self, timeout: float = WAIT) -> ClientStream:
        """The next stream the client opened (its HEADERS have arrived)."""
        def fresh() -> list[int]:
            return sorted(set(self.streams) - self._handed_out)

        self.wait_until(lambda: bool(fresh()), "a new stream", timeout)
        stream_id = fresh()[0]
        self._handed_out.add(stream_id)
        return self.streams[stream_id]

    def read_request(self, timeout: float = WAIT) -> ClientStream:
        """The next stream, once the client has sent all of it (END_STREAM) or reset it."""
        stream = self.next_stream(timeout)
        self.wait_until(lambda: stream.ended or stream.reset is not None, f"the end of stream {stream.id}", timeout)
        return stream

    def _absorb(self, got: Frame) -> None:
        self.frames.append(got)
        kind, flags, stream_id, payload = got
        if self._block is not None and (kind != CONTINUATION or stream_id != self._block[0]):
            raise AssertionError("the client interrupted a header block")
        if kind == HEADERS:
            assert not flags & (PADDED | PRIORITY_FLAG), "the client padded its HEADERS or sent priority"
            self._block = (stream_id, flags, bytearray(payload))
        elif kind == CONTINUATION:
            assert self._block is not None, "a CONTINUATION without HEADERS"
            self._block[2].extend(payload)
        elif kind == DATA:
            self.streams[stream_id].add_data(payload, flags)
        elif kind == RST_STREAM:
            self.streams[stream_id].reset = int.from_bytes(payload, "big")
        elif kind == SETTINGS:
            if flags & ACK:
                self.settings_acks += 1
            else:
                self.client_settings = dict(struct.iter_unpack(">HI", payload))
        elif kind == PING:
            if flags & ACK:
                self.ping_acks.append(payload)
            else:
                self.pings.append(payload)
                if self.answer_pings:
                    self.send(frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE:
            self.window_updates.append((stream_id, int.from_bytes(payload, "big")))
        if kind in (HEADERS, CONTINUATION) and flags & END_HEADERS:
            block_id, block_flags, block = self._block  # type: ignore[misc]
            self._block = None
            assert block_id not in self.streams, "the client sent trailers"
            fields = [(str(name), str(value)) for name, value in self.decoder.decode(bytes(block))]
            self.streams[block_id] = ClientStream(block_id, fields, ended=bool(block_flags & END_STREAM))

    # writing
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def handshake(self, settings: dict[int, int] | None = None, extra: bytes = b"") -> None:
        """Read the client's preface and SETTINGS; send ours and the ACK of theirs (and ``extra``)
        in one write."""
        assert self.read_exact(len(PREFACE)) == PREFACE
        self.wait_until(lambda: self.client_settings is not None, "the client's SETTINGS")
        payload = b"".join(struct.pack(">HI", key, value) for key, value in (settings or {}).items())
        self.send(frame(SETTINGS, 0, 0, payload) + frame(SETTINGS, ACK, 0) + extra)

    def send_headers(self, stream_id: int, fields: list[tuple[str, str]], *, end_stream: bool = False,
                     pieces: int = 1, padding: int = 0, priority: bool = False) -> None:
        """One header block, in a HEADERS frame and ``pieces - 1`` CONTINUATION frames."""
        block = self.encoder.encode(fields)
        size = -(-len(block) // pieces)
        parts = [block[start : start + size] for start in range(0, len(block), size)] or [b""]
        flags = (END_STREAM if end_stream else 0) | (END_HEADERS if len(parts) == 1 else 0)
        first = parts[0]
        if priority:
            first = b"\x00\x00\x00\x00\x0f" + first
            flags |= PRIORITY_FLAG
        if padding:
            first = bytes((padding,)) + first + b"\x00" * padding
            flags |= PADDED
        out = frame(HEADERS, flags, stream_id, first)
        for number, part in enumerate(parts[1:], start=2):
            out += frame(CONTINUATION, END_HEADERS if number == len(parts) else 0, stream_id, part)
        self.send(out)

    def send_data(self, stream_id: int, data: bytes, *, end_stream: bool = False, padding: int = 0) -> None:
        flags = END_STREAM if end_stream else 0
        if padding:
            data = bytes((padding,)) + data + b"\x00" * padding
            flags |= PADDED
        self.send(frame(DATA, flags, stream_id, data))

    def send_message(self, stream_id: int, body: bytes) -> None:
        self.send_data(stream_id, grpc_message(body))

    def send_trailers(self, stream_id: int, status: int = 0, message: str | None = None) -> None:
        fields = [("grpc-status", str(status))] + ([("grpc-message", message)] if message is not None else [])
        self.send_headers(stream_id, fields, end_stream=True)

    def respond(self, stream_id: int, body: bytes | None = None, status: int = 0, message: str | None = None) -> None:
        self.send_headers(stream_id, RESPONSE_HEADERS)
        if body is not None:
            self.send_message(stream_id, body)
        self.send_trailers(stream_id, status, message)

    def send_rst(self, stream_id: int, code: int) -> None:
        self.send(frame(RST_STREAM, 0, stream_id, struct.pack(">I", code)))

    def send_goaway(self, last_stream_id: int, code: int = 0, debug: bytes = b"") -> None:
        self.send(frame(GOAWAY, 0, 0, struct.pack(">II", last_stream_id, code) + debug))

    def send_window_update(self, stream_id: int, increment: int) -> None:
        self.send(frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", increment)))

    def send_settings(self, settings: dict[int, int]) -> None:
        self.send(frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", key, value) for key, value in settings.items())))

    def start_tls(self, context: ssl.SSLContext) -> None:
        self.sock.settimeout(WAIT)
        self.sock = context.wrap_socket(self.sock, server_side=True)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


Script = Callable[[Peer], None]


class ScriptedServer:
    """Listens on 127.0.0.1; the n-th accepted connection runs ``scripts[n]`` (the last one for
    any further connection) after the HTTP/2 handshake (skipped with ``handshake=False``)."""

    def __init__(self, scripts: tuple[Script, ...], *, settings: dict[int, int] | None = None,
                 handshake: bool = True, tls: ssl.SSLContext | None = None) -> None:
        self._scripts = scripts
        self._settings = settings
        self._handshake = handshake
        self._tls = tls
        self.peers: list[Peer] = []
        self.errors: list[str] = []
        self.tls_failures: list[str] = []
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.port = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept_loop, name="h2-test accept", daemon=True)
        self._acceptor.start()

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint("127.0.0.1", self.port)

    @property
    def accepted(self) -> int:
        return len(self.peers)

    def peer(self, index: int, timeout: float = WAIT) -> Peer:
        """The ``index``-th accepted connection (waits for it)."""
        deadline = time.monotonic() + timeout
        while len(self.peers) <= index:
            if time.monotonic() > deadline:
                raise AssertionError(f"connection {index} was never accepted")
            time.sleep(0.005)
        return self.peers[index]

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self._lock:
                if self._stopping.is_set():
                    sock.close()
                    return
                peer = Peer(sock, len(self.peers))
                self.peers.append(peer)
                thread = threading.Thread(target=self._run, args=(peer,), name=f"h2-test peer {peer.index}",
                                          daemon=True)
                self._threads.append(thread)
            thread.start()

    def _run(self, peer: Peer) -> None:
        script = self._scripts[min(peer.index, len(self._scripts) - 1)]
        try:
            if self._tls is not None:
                try:
                    peer.start_tls(self._tls)
                except (ssl.SSLError, OSError) as error:
                    self.tls_failures.append(str(error))
                    return
            if self._handshake:
                peer.handshake(self._settings)
            script(peer)
        except ClientClosed:
            pass
        except Exception:
            if not self._stopping.is_set():
                self.errors.append(f"connection {peer.index}: {traceback.format_exc()}")

    def close(self) -> list[str]:
        """Stop; returns what went wrong (script errors, threads that did not stop)."""
        self._stopping.set()
        self._acceptor.join(WAIT)
        self._listener.close()
        with self._lock:
            peers, threads = list(self.peers), list(self._threads)
        for peer in peers:
            peer.close()
        for thread in threads:
            thread.join(WAIT)
        return self.errors + [f"{thread.name} did not stop" for thread in threads + [self._acceptor]
                              if thread.is_alive()]


class Background:
    """``function()`` on a thread of its own, with a bounded wait for its outcome."""

    def __init__(self, function: Callable[[], Any]) -> None:
        self._function = function
        self._done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="h2-test background", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.value = self._function()
        except BaseException as error:  # handed to the test thread
            self.error = error
        finally:
            self._done.set()

    def wait(self, timeout: float = WAIT) -> BaseException | None:
        if not self._done.wait(timeout):
            raise AssertionError(f"still running after {timeout:g}s")
        return self.error

    def result(self, timeout: float = WAIT) -> Any:
        if self.wait(timeout) is not None:
            raise self.error  # type: ignore[misc]
        return self.value


class Harness:
    """Makes servers, channels and connections, and closes them all at the end of a test."""

    def __init__(self) -> None:
        self._servers: list[ScriptedServer] = []
        self._channels: list[NativeChannel] = []
        self._connections: list[H2Connection] = []
        self._background: list[Background] = []

    def server(self, *scripts: Script, **options: Any) -> ScriptedServer:
        server = ScriptedServer(scripts, **options)
        self._servers.append(server)
        return server

    def channel(self, target: ScriptedServer | Endpoint, *, dial_timeout: float = 2.0,
                tls: ssl.SSLContext | None = None) -> NativeChannel:
        endpoint = target.endpoint if isinstance(target, ScriptedServer) else target
        channel = NativeChannel(endpoint, tls, dial_timeout=dial_timeout)
        self._channels.append(channel)
        return channel

    def connection(self, server: ScriptedServer, **keepalive: float) -> H2Connection:
        connection = H2Connection(server.endpoint, None, 2.0, **keepalive)
        self._connections.append(connection)
        return connection

    def background(self, function: Callable[[], Any]) -> Background:
        job = Background(function)
        self._background.append(job)
        return job

    def take(self, call: Any, count: int) -> list[Any]:
        """The next ``count`` responses of a stream call; cancels it if they do not come in time."""
        job = self.background(lambda: [next(call) for _ in range(count)])
        try:
            return job.result()
        except AssertionError:
            call.cancel()
            raise

    def close(self) -> list[str]:
        for channel in self._channels:
            channel.close()
        for connection in self._connections:
            connection.close("the test is over")
        problems = []
        for server in self._servers:
            problems += server.close()
        for job in self._background:
            job.thread.join(WAIT)
            if job.thread.is_alive():
                problems.append("a background call did not end")
        return problems


@pytest.fixture
def h2():
    before = set(threading.enumerate())
    harness = Harness()
    yield harness
    problems = harness.close()
    started = [thread for thread in threading.enumerate() if thread not in before and thread.name.startswith("etcd-h2")]
    for thread in started:
        thread.join(WAIT)
    problems += [f"transport thread {thread.name!r} still running" for thread in started if thread.is_alive()]
    assert not problems, "\n".join(problems)


def kv_range(channel: NativeChannel) -> Any:
    return channel.unary_unary("/etcdserverpb.KV/Range", request_serializer=RangeRequest.SerializeToString,
                               response_deserializer=RangeResponse.FromString)


def watch(channel: NativeChannel) -> Any:
    return channel.stream_stream("/etcdserverpb.Watch/Watch", request_serializer=WatchRequest.SerializeToString,
                                 response_deserializer=WatchResponse.FromString)


def watch_request(key: bytes) -> WatchRequest:
    return WatchRequest(create_request=WatchCreateRequest(key=key))


def serve_ranges(peer: Peer) -> None:
    """Answer every Range request with count = the number of requests so far, until the client closes."""
    number = 0
    while True:
        request = peer.read_request(timeout=10 * WAIT)
        number += 1
        peer.respond(request.id, RangeResponse(count=number).SerializeToString())


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- unary calls -------------------------------------------------------------------------------
def test_a_unary_call_sends_grpc_request_headers_and_returns_the_decoded_response(h2):
    requests = []

    def script(peer):
        for _ in range(2):
            request = peer.read_request()
            requests.append(request)
            reply = RangeResponse(count=1, kvs=[KeyValue(key=b"k1", value=b"v" * 300)])
            peer.respond(request.id, reply.SerializeToString())

    server = h2.server(script)
    call = kv_range(h2.channel(server))

    response = call(RangeRequest(key=b"k1", range_end=b"k2"), timeout=3.0, metadata=[("token", "abc")])
    assert response == RangeResponse(count=1, kvs=[KeyValue(key=b"k1", value=b"v" * 300)])
    assert h2.background(lambda: call(RangeRequest(key=b"k2"))).result().count == 1  # no timeout

    first, second = requests
    names = [name for name, _ in first.fields]
    assert names[:4] == [":method", ":scheme", ":path", ":authority"]  # pseudo-headers first
    headers = first.headers
    assert headers[":method"] == "POST" and headers[":scheme"] == "http"
    assert headers[":path"] == "/etcdserverpb.KV/Range"
    assert headers[":authority"] == f"127.0.0.1:{server.port}"
    assert headers["content-type"] == "application/grpc"
    assert headers["te"] == "trailers"
    assert headers["token"] == "abc"
    assert re.fullmatch(r"\d{1,8}m", headers["grpc-timeout"]) and 2_000 < int(headers["grpc-timeout"][:-1]) <= 3_000
    assert [RangeRequest.FromString(message) for message in first.messages] == [
        RangeRequest(key=b"k1", range_end=b"k2")]
    assert first.ended and first.data_frames[-1][1] & END_STREAM
    assert "grpc-timeout" not in second.headers and "token" not in second.headers
    assert second.id == first.id + 2 and server.accepted == 1  # the same connection, the next stream


def test_a_request_header_block_larger_than_the_maximum_frame_size_is_split_into_continuation_frames(h2):
    sizes = []

    def script(peer):
        request = peer.read_request()
        sizes.extend(len(got.payload) for got in peer.frames if got.kind in (HEADERS, CONTINUATION))
        peer.respond(request.id, RangeResponse(count=1).SerializeToString())

    call = kv_range(h2.channel(h2.server(script)))
    assert call(RangeRequest(), timeout=WAIT, metadata=[("x-big", "v" * 20_000)]).count == 1
    assert sum(sizes) > 20_000 and max(sizes) <= 16_384


def grpc_error(peer, stream_id):
    peer.respond(stream_id, status=5, message="key%20not%20found: %25 caf%C3%A9")


def trailers_only(peer, stream_id):
    peer.send_headers(stream_id, RESPONSE_HEADERS + [("grpc-status", "7"), ("grpc-message", "permission%20denied")],
                      end_stream=True)


def http_404(peer, stream_id):
    peer.send_headers(stream_id, [(":status", "404"), ("content-type", "text/plain")])
    peer.wait_until(lambda: peer.streams[stream_id].reset is not None, "the client's RST_STREAM")
    assert peer.streams[stream_id].reset == ErrorCode.CANCEL


def http_503_only(peer, stream_id):
    peer.send_headers(stream_id, [(":status", "503")], end_stream=True)


def data_ends_stream(peer, stream_id):
    peer.send_headers(stream_id, RESPONSE_HEADERS)
    peer.send_data(stream_id, grpc_message(b""), end_stream=True)


def two_messages(peer, stream_id):
    peer.send_headers(stream_id, RESPONSE_HEADERS)
    peer.send_message(stream_id, b"")
    peer.send_message(stream_id, b"")
    peer.send_trailers(stream_id)


def ends_inside_a_message(peer, stream_id):
    peer.send_headers(stream_id, RESPONSE_HEADERS)
    peer.send_data(stream_id, grpc_message(b"abcdef")[:7])
    peer.send_trailers(stream_id)


@pytest.mark.parametrize(
    "answer, code, details",
    [
        (grpc_error, grpc.StatusCode.NOT_FOUND, "key not found: % caf\u00e9"),
        (trailers_only, grpc.StatusCode.PERMISSION_DENIED, "permission denied"),
        (http_404, grpc.StatusCode.UNIMPLEMENTED, "HTTP status 404 (text/plain)"),
        (http_503_only, grpc.StatusCode.UNAVAILABLE, "HTTP status 503"),
        (data_ends_stream, grpc.StatusCode.INTERNAL, "without a gRPC status"),
        (two_messages, grpc.StatusCode.INTERNAL, "2 messages"),
        (ends_inside_a_message, grpc.StatusCode.INTERNAL, "inside a message"),
    ],
    ids=["grpc-error", "trailers-only", "http-404", "http-503-trailers-only", "no-trailers", "two-messages",
         "cut-message"],
)
def test_a_failed_unary_call_raises_call_error_and_the_connection_stays_usable(h2, answer, code, details):
    def script(peer):
        answer(peer, peer.read_request().id)
        serve_ranges(peer)

    server = h2.server(script)
    call = kv_range(h2.channel(server))
    with pytest.raises(CallError) as caught:
        call(RangeRequest(key=b"k"), timeout=WAIT)
    assert isinstance(caught.value, grpc.RpcError)
    assert caught.value.code() == code
    assert details in caught.value.details()
    assert call(RangeRequest(key=b"k"), timeout=WAIT).count == 1
    assert server.accepted == 1


@pytest.mark.parametrize(
    "error_code, status",
    [
        (ErrorCode.REFUSED_STREAM, grpc.StatusCode.UNAVAILABLE),
        (ErrorCode.CANCEL, grpc.StatusCode.CANCELLED),
        (ErrorCode.ENHANCE_YOUR_CALM, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (ErrorCode.PROTOCOL_ERROR, grpc.StatusCode.INTERNAL),
        (0xAB, grpc.StatusCode.INTERNAL),
    ],
    ids=["refused", "cancel", "calm", "protocol-error", "unknown-code"],
)
def test_a_stream_reset_by_the_server_fails_the_call_with_the_mapped_status(h2, error_code, status):
    def script(peer):
        peer.send_rst(peer.read_request().id, error_code)
        serve_ranges(peer)

    server = h2.server(script)
    call = kv_range(h2.channel(server))
    with pytest.raises(CallError) as caught:
        call(RangeRequest(), timeout=WAIT)
    assert caught.value.code() == status
    name = ErrorCode(error_code).name if error_code in ErrorCode._value2member_map_ else str(error_code)
    assert caught.value.details() == f"the server reset the stream ({name})"
    assert call(RangeRequest(), timeout=WAIT).count == 1


def test_a_call_past_its_deadline_fails_deadline_exceeded_and_resets_its_stream(h2):
    resets = []

    def script(peer):
        peer.answer_pings = True
        request = peer.read_request()
        peer.wait_until(lambda: request.reset is not None, "the client's RST_STREAM")
        resets.append((request.id, request.reset, request.headers["grpc-timeout"]))
        peer.wait_until(lambda: peer.pings, "a PING probing the connection after the timeout")
        serve_ranges(peer)

    server = h2.server(script)
    call = kv_range(h2.channel(server))
    started = time.monotonic()
    with pytest.raises(CallError) as caught:
        call(RangeRequest(), timeout=0.3)
    elapsed = time.monotonic() - started
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert 0.28 <= elapsed < 1.5
    assert call(RangeRequest(), timeout=WAIT).count == 1  # the connection survived (its PING probe was answered)
    [(stream_id, code, grpc_timeout)] = resets
    assert stream_id == 1 and code == ErrorCode.CANCEL
    assert re.fullmatch(r"\d+m", grpc_timeout) and int(grpc_timeout[:-1]) <= 300


def test_frames_the_client_may_ignore_do_not_disturb_a_call(h2):
    def script(peer):
        request = peer.read_request()
        peer.send(frame(PRIORITY, 0, request.id, b"\x00\x00\x00\x00\x10"))
        peer.send(frame(0xFA, 0xFF, 0, b"unknown frame type"))
        peer.send_window_update(99, 10)  # a stream that never existed
        peer.send_rst(97, ErrorCode.CANCEL)
        peer.send_data(95, b"late data for a closed stream")
        peer.respond(request.id, RangeResponse(count=42).SerializeToString())

    call = kv_range(h2.channel(h2.server(script)))
    assert call(RangeRequest(), timeout=WAIT).count == 42


@pytest.mark.parametrize(
    "violation",
    [
        lambda peer, sid: peer.send(frame(PUSH_PROMISE, END_HEADERS, sid, b"\x00\x00\x00\x02\x88")),
        lambda peer, sid: peer.send(frame(CONTINUATION, END_HEADERS, sid, b"\x88")),
        lambda peer, sid: peer.send(frame(HEADERS, 0, sid, peer.encoder.encode(RESPONSE_HEADERS))
                                    + frame(DATA, 0, sid, grpc_message(b""))),
        lambda peer, sid: peer.send(frame(HEADERS, END_HEADERS, sid, peer.encoder.encode(RESPONSE_HEADERS))
                                    + frame(DATA, 0, sid, b"\x01" + 4 * b"\x00")),
        lambda peer, sid: peer.send(frame(HEADERS, END_HEADERS, sid, b"\xff\xff\xff\xff\xff\xff")),
        lambda peer, sid: peer.send(frame(SETTINGS, 0, 0, b"\x00" * 7)),
        lambda peer, sid: peer.send(frame(DATA, PADDED, sid, b"\x09abc")),
    ],
    ids=["push-promise", "continuation-alone", "interrupted-header-block", "compressed-message", "bad-hpack",
         "bad-settings-length", "bad-padding"],
)
def test_a_protocol_violation_drops_the_connection_and_fails_its_calls_unavailable(h2, violation):
    def script(peer):
        violation(peer, peer.read_request().id)
        peer.wait_closed()

    server = h2.server(script, serve_ranges)
    call = kv_range(h2.channel(server))
    with pytest.raises(CallError) as caught:
        call(RangeRequest(), timeout=WAIT)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "lost" in caught.value.details() and not caught.value.details().startswith(NOT_SENT)
    assert server.peer(0).closed.wait(WAIT)  # the client closed the broken connection
    assert call(RangeRequest(), timeout=WAIT).count == 1  # and the next call opens another
    assert server.accepted == 2


# -- connections going away --------------------------------------------------------------------
def test_goaway_below_an_in_flight_stream_fails_it_as_not_sent_and_the_next_call_reconnects(h2):
    def going_away(peer):
        request = peer.read_request()
        peer.send_goaway(request.id - 1, ErrorCode.NO_ERROR, b"shutting down")  # 0: none processed
        peer.wait_closed()

    server = h2.server(going_away, serve_ranges)
    call = kv_range(h2.channel(server))
    with pytest.raises(CallError) as caught:
        call(RangeRequest(), timeout=WAIT)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert caught.value.details().startswith(NOT_SENT)
    assert "GOAWAY NO_ERROR: shutting down" in caught.value.details()
    assert server.peer(0).closed.wait(WAIT)  # drained: the client closed the old connection
    assert call(RangeRequest(), timeout=WAIT).count == 1
    assert server.accepted == 2


def test_goaway_at_an_in_flight_stream_lets_it_finish_and_later_calls_use_a_new_connection(h2):
    def going_away(peer):
        request = peer.read_request()
        peer.send_goaway(request.id)
        peer.respond(request.id, RangeResponse(count=7).SerializeToString())
        peer.wait_closed()

    server = h2.server(going_away, serve_ranges)
    call = kv_range(h2.channel(server))
    assert call(RangeRequest(), timeout=WAIT).count == 7
    assert server.peer(0).closed.wait(WAIT)
    assert call(RangeRequest(), timeout=WAIT).count == 1
    assert server.accepted == 2


def test_a_connection_closed_by_the_server_mid_call_fails_it_unavailable_and_the_next_call_reconnects(h2):
    def closing(peer):
        peer.read_request()
        peer.close()

    server = h2.server(closing, serve_ranges)
    call = kv_range(h2.channel(server))
    with pytest.raises(CallError) as caught:
        call(RangeRequest(), timeout=WAIT)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert not caught.value.details().startswith(NOT_SENT)  # sent: the outcome is unknown
    assert "lost" in caught.value.details()
    assert call(RangeRequest(), timeout=WAIT).count == 1
    assert server.accepted == 2


# -- connecting --------------------------------------------------------------------------------
def test_the_client_greets_with_the_preface_its_settings_and_a_connection_window_update(h2):
    def script(peer):
        peer.wait_until(lambda: peer.settings_acks == 1 and peer.window_updates, "the client's ACK")

    server = h2.server(script)
    assert h2.channel(server).dial(WAIT) is True
    peer = server.peer(0)
    assert peer.client_settings == {Setting.ENABLE_PUSH: 0, Setting.INITIAL_WINDOW_SIZE: MAX_WINDOW}
    assert peer.window_updates[0] == (0, MAX_WINDOW - 65_535)


def http1_answer(peer):
    peer.send(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    peer.drain_until_closed()


def close_at_once(peer):
    peer.close()


@pytest.mark.parametrize(
    "script, expected",
    [(http1_answer, "HTTP/2"), (close_at_once, "socket closed")],
    ids=["http1-server", "closes-at-once"],
)
def test_a_server_that_does_not_speak_http2_fails_the_call_as_not_sent(h2, script, expected):
    server = h2.server(script, handshake=False)
    with pytest.raises(CallError) as caught:
        kv_range(h2.channel(server))(RangeRequest(), timeout=WAIT)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert caught.value.details().startswith(NOT_SENT)
    assert expected in caught.value.details()


def test_a_refused_connection_fails_calls_as_not_sent_and_dial_reports_it_settled(h2):
    channel = h2.channel(Endpoint("127.0.0.1", unused_port()))
    with pytest.raises(CallError) as caught:
        kv_range(channel)(RangeRequest(), timeout=WAIT)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert caught.value.details().startswith(NOT_SENT)
    assert "connection refused" in caught.value.details().lower()
    started = time.monotonic()
    assert channel.dial(WAIT) is True  # an answer (a refusal), not silence
    assert time.monotonic() - started < 1.0
    assert channel.failed and not channel.connected


def test_dial_returns_false_when_the_server_accepts_but_sends_no_settings_in_time(h2):
    server = h2.server(lambda peer: peer.drain_until_closed(), handshake=False)
    channel = h2.channel(server)
    started = time.monotonic()
    assert channel.dial(0.3) is False
    assert 0.25 <= time.monotonic() - started < 1.5
    assert server.peer(0).closed.wait(WAIT)  # the client gave up and closed the socket
    assert not channel.connected


def test_a_server_ping_is_answered_with_the_same_payload_and_server_settings_are_acked(h2):
    done = threading.Event()

    def script(peer):
        peer.wait_until(lambda: peer.settings_acks == 1, "the ACK of our first SETTINGS")
        peer.send(frame(PING, 0, 0, b"\x01\x02\x03\x04\x05\x06\x07\x08"))
        peer.wait_until(lambda: peer.ping_acks, "the PING ACK")
        peer.send_settings({Setting.MAX_CONCURRENT_STREAMS: 50, Setting.MAX_FRAME_SIZE: 32_768})
        peer.wait_until(lambda: peer.settings_acks == 2, "the ACK of our second SETTINGS")
        done.set()
        peer.wait_closed()

    server = h2.server(script)
    assert h2.channel(server).dial(WAIT)
    assert done.wait(WAIT)
    assert server.peer(0).ping_acks == [b"\x01\x02\x03\x04\x05\x06\x07\x08"]
    assert server.peer(0).pings == []


def test_frames_that_arrive_with_the_servers_settings_are_handled_at_once(h2):
    answered, looked = [], threading.Event()

    def script(peer):
        peer.handshake(extra=frame(PING, 0, 0, b"greeting"))  # SETTINGS, ACK and PING in one write
        try:
            peer.wait_until(lambda: peer.ping_acks, "the PING ACK", timeout=1.0)
        except AssertionError:
            pass
        answered.extend(peer.ping_acks)
        looked.set()
        peer.wait_closed()

    server = h2.server(script, handshake=False)
    assert h2.channel(server).dial(WAIT)
    assert looked.wait(WAIT)
    assert answered == [b"greeting"]


# -- flow control ------------------------------------------------------------------------------
def test_a_request_larger_than_the_window_waits_for_window_updates_without_blocking_the_caller(h2):
    window_used, go = threading.Event(), threading.Event()
    seen = {}

    def script(peer):
        stream = peer.next_stream()
        peer.wait_until(lambda: len(stream.body) >= 100, "the first 100 bytes")
        peer.idle(0.2)
        seen["before any update"] = len(stream.body)
        window_used.set()
        assert go.wait(WAIT)
        peer.send_window_update(stream.id, 300)
        peer.wait_until(lambda: len(stream.body) >= 400, "300 more bytes")
        peer.idle(0.2)
        seen["after +300"] = len(stream.body)
        peer.send_window_update(stream.id, 100_000)
        peer.wait_until(lambda: stream.ended, "the end of the request")
        seen["frames"] = list(stream.data_frames)
        seen["messages"] = list(stream.messages)
        peer.respond(stream.id, RangeResponse(count=7).SerializeToString())
        peer.wait_closed()

    server = h2.server(script, settings={Setting.INITIAL_WINDOW_SIZE: 100})
    connection = h2.connection(server)
    body = RangeRequest(key=b"k" * 1_000).SerializeToString()
    starting = h2.background(lambda: connection.start("/etcdserverpb.KV/Range", (), WAIT, RangeResponse.FromString,
                                                      body))
    stream = starting.result()  # returned although most of the request waits for window
    assert window_used.wait(WAIT)
    assert stream.code is None  # the call is still waiting for its response
    go.set()
    assert stream.done.acquire(timeout=WAIT)
    assert stream.code == grpc.StatusCode.OK
    assert [RangeResponse.FromString(message).count for message in stream.messages] == [7]
    assert seen["before any update"] == 100 and seen["after +300"] == 400
    assert sum(length for length, _ in seen["frames"]) == len(body) + 5
    assert [flags & END_STREAM for _, flags in seen["frames"]] == [0] * (len(seen["frames"]) - 1) + [END_STREAM]
    assert seen["messages"] == [body]


def grant_in_steps(peer, stream):
    """Open the stream's window 100 bytes at a time, as each 100 bytes arrive."""
    granted, overshoot = 100, 0
    while True:
        peer.wait_until(lambda: stream.ended or len(stream.body) >= granted, f"{granted} bytes")
        overshoot = max(overshoot, len(stream.body) - granted)
        if stream.ended:
            return overshoot
        peer.send_window_update(stream.id, 100)
        granted += 100


def grant_by_settings(peer, stream):
    """Raise SETTINGS_INITIAL_WINDOW_SIZE once the first 100 bytes arrived (applies to open streams)."""
    peer.wait_until(lambda: len(stream.body) >= 100, "the first 100 bytes")
    peer.idle(0.1)
    overshoot = len(stream.body) - 100
    peer.send_settings({Setting.INITIAL_WINDOW_SIZE: 1 << 20})
    peer.wait_until(lambda: stream.ended and peer.settings_acks == 2, "the rest and the SETTINGS ACK")
    return overshoot


@pytest.mark.parametrize("grant", [grant_in_steps, grant_by_settings], ids=["window-updates", "settings"])
def test_a_unary_request_is_sent_as_the_server_opens_its_window(h2, grant):
    seen = {}

    def script(peer):
        stream = peer.next_stream()
        seen["overshoot"] = grant(peer, stream)
        seen["frames"] = list(stream.data_frames)
        seen["requests"] = [RangeRequest.FromString(message) for message in stream.messages]
        peer.respond(stream.id, RangeResponse(count=len(stream.messages[0])).SerializeToString())

    server = h2.server(script, settings={Setting.INITIAL_WINDOW_SIZE: 100})
    request = RangeRequest(key=b"k" * 1_000, range_end=b"z")
    assert kv_range(h2.channel(server))(request, timeout=WAIT).count == request.ByteSize()
    assert seen["requests"] == [request]
    assert seen["overshoot"] == 0
    assert seen["frames"][0][0] == 100
    assert sum(length for length, _ in seen["frames"]) == request.ByteSize() + 5


def test_a_request_waits_for_the_connection_window_and_respects_the_maximum_frame_size(h2):
    seen = {}

    def script(peer):
        stream = peer.next_stream()
        peer.wait_until(lambda: len(stream.body) >= 65_535, "the connection window's worth")
        peer.idle(0.2)
        seen["before update"] = len(stream.body)
        peer.send_window_update(0, 1 << 20)
        peer.wait_until(lambda: stream.ended, "the end of the request")
        seen["frames"] = list(stream.data_frames)
        peer.respond(stream.id, RangeResponse(count=len(stream.messages[0])).SerializeToString())

    server = h2.server(script, settings={Setting.INITIAL_WINDOW_SIZE: 1 << 20})
    request = RangeRequest(key=b"k" * 100_000)
    assert kv_range(h2.channel(server))(request, timeout=WAIT).count == request.ByteSize()
    assert seen["before update"] == 65_535
    assert max(length for length, _ in seen["frames"]) <= 16_384
    assert sum(length for length, _ in seen["frames"]) == request.ByteSize() + 5


def test_a_large_response_over_several_data_frames_and_continuation_frames_is_reassembled(h2):
    reply = RangeResponse(count=3, kvs=[KeyValue(key=b"k%d" % n, value=bytes([n]) * 30_000) for n in range(3)])

    def script(peer):
        request = peer.read_request()
        fields = RESPONSE_HEADERS + [("x-filler", "f" * 3_000), ("x-more", "m" * 200)]
        peer.send_headers(request.id, fields, pieces=3, padding=7, priority=True)
        data = grpc_message(reply.SerializeToString())
        cuts = [0, 3, 5, 1_000] + list(range(1_000, len(data), 16_000)) + [len(data)]
        for number, (start, end) in enumerate(zip(cuts, cuts[1:])):
            if end > start:
                peer.send_data(request.id, data[start:end], padding=(number % 3) * 5)
        peer.send_headers(request.id, [("grpc-status", "0"), ("x-trailer", "t" * 500)], end_stream=True, pieces=2)
        serve_ranges(peer)

    call = kv_range(h2.channel(h2.server(script)))
    assert call(RangeRequest(), timeout=WAIT) == reply
    assert call(RangeRequest(), timeout=WAIT).count == 1  # the header table stayed in step


# -- bidirectional streams ---------------------------------------------------------------------
def test_a_stream_sends_requests_from_the_putting_thread_and_half_closes_on_none(h2, monkeypatch):
    sends = []
    original = transport._PlainWire.send

    def recording(self, data):
        sends.append((threading.current_thread(), bytes(data)))
        original(self, data)

    monkeypatch.setattr(transport._PlainWire, "send", recording)
    seen = {}

    def script(peer):
        stream = peer.next_stream()
        peer.wait_until(lambda: len(stream.messages) >= 2, "two requests")
        peer.send_headers(stream.id, RESPONSE_HEADERS)
        for number in range(3):
            peer.send_message(stream.id, WatchResponse(watch_id=number, created=True).SerializeToString())
        peer.wait_until(lambda: stream.ended, "the half-close")
        seen["messages"] = [WatchRequest.FromString(message) for message in stream.messages]
        seen["headers"] = stream.headers
        peer.send_trailers(stream.id)

    server = h2.server(script)
    requests = RequestQueue()
    requests.put(watch_request(b"a"))  # queued: sent when the call attaches
    call = watch(h2.channel(server))(requests, metadata=[("token", "abc")])
    second = watch_request(b"second-request")
    requests.put(second)
    assert [response.watch_id for response in h2.take(call, 3)] == [0, 1, 2]
    requests.put(None)
    assert h2.background(lambda: list(call)).result() == []  # the OK trailers end the iteration
    assert seen["messages"] == [watch_request(b"a"), second]
    assert seen["headers"][":path"] == "/etcdserverpb.Watch/Watch" and seen["headers"]["token"] == "abc"
    assert "grpc-timeout" not in seen["headers"]
    senders = {thread for thread, data in sends if second.SerializeToString() in data}
    assert senders == {threading.current_thread()}
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("etcd-h2 send")]
    assert call.ended


def test_a_stream_fed_by_an_iterable_sends_every_request_then_half_closes(h2):
    seen = []

    def script(peer):
        stream = peer.read_request()
        seen.extend(WatchRequest.FromString(message).create_request.key for message in stream.messages)
        peer.send_headers(stream.id, RESPONSE_HEADERS)
        peer.send_message(stream.id, WatchResponse(watch_id=len(stream.messages)).SerializeToString())
        peer.send_trailers(stream.id)

    call = watch(h2.channel(h2.server(script)))(iter([watch_request(b"%d" % n) for n in range(5)]))
    assert [response.watch_id for response in h2.background(lambda: list(call)).result()] == [5]
    assert seen == [b"0", b"1", b"2", b"3", b"4"]


def test_cancelling_a_stream_fails_its_reader_cancelled_and_resets_it_on_the_server(h2):
    seen, reset_seen = {}, threading.Event()

    def script(peer):
        stream = peer.next_stream()
        peer.wait_until(lambda: stream.messages, "a request")
        peer.send_headers(stream.id, RESPONSE_HEADERS)
        peer.send_message(stream.id, WatchResponse(watch_id=1).SerializeToString())
        peer.wait_until(lambda: stream.reset is not None, "the client's RST_STREAM")
        peer.idle(0.1)  # a request put after the cancel would arrive now
        seen["reset"], seen["requests"] = stream.reset, len(stream.messages)
        reset_seen.set()

    server = h2.server(script)
    requests = RequestQueue()
    call = watch(h2.channel(server))(requests)
    requests.put(watch_request(b"a"))
    assert [response.watch_id for response in h2.take(call, 1)] == [1]
    assert call.cancel() is True
    for _ in range(2):  # and again: every later read sees the end too
        with pytest.raises(CallError) as caught:
            h2.take(call, 1)
        assert caught.value.code() == grpc.StatusCode.CANCELLED
    requests.put(watch_request(b"ignored"))  # after the end: dropped, no error
    with pytest.raises(CallError):
        call.wait_end(WAIT)
    assert reset_seen.wait(WAIT)
    assert seen == {"reset": ErrorCode.CANCEL, "requests": 1}


@pytest.mark.parametrize("status, message", [(0, None), (13, "boom%21")], ids=["ok", "error"])
def test_listen_delivers_responses_on_the_reader_thread_and_wait_end_reports_the_end(h2, status, message):
    def script(peer):
        stream = peer.next_stream()
        peer.wait_until(lambda: stream.messages, "a request")
        peer.send_headers(stream.id, RESPONSE_HEADERS)
        for number in range(3):
            peer.send_message(stream.id, WatchResponse(watch_id=number).SerializeToString())
        peer.send_trailers(stream.id, status, message)
        peer.wait_closed()

    server = h2.server(script)
    requests = RequestQueue()
    call = watch(h2.channel(server))(requests)
    got, threads, ends = [], [], []
    ended = threading.Event()

    def on_message(response):
        got.append(response.watch_id)
        threads.append(threading.current_thread().name)

    def on_end():
        ends.append(1)
        ended.set()

    call.listen(on_message, on_end)
    assert call.wait_end(0.05) is False
    requests.put(watch_request(b"a"))
    assert ended.wait(WAIT)
    if status == 0:
        assert call.wait_end(WAIT) is True
        assert call.wait_end(0) is True  # again: the end stays observable
    else:
        with pytest.raises(CallError) as caught:
            call.wait_end(WAIT)
        assert caught.value.code() == grpc.StatusCode.INTERNAL and caught.value.details() == "boom!"
    assert got == [0, 1, 2]
    assert set(threads) == {f"etcd-h2 127.0.0.1:{server.port}"}
    assert ends == [1]


def test_a_stream_call_past_its_deadline_fails_deadline_exceeded(h2):
    server = h2.server(lambda peer: peer.wait_closed())
    call = watch(h2.channel(server))(RequestQueue(), timeout=0.3)
    reading = h2.background(lambda: next(call))
    try:
        error = reading.wait(1.5)
    except AssertionError:
        error = None
    finally:
        call.cancel()
    assert isinstance(error, CallError) and error.code() == grpc.StatusCode.DEADLINE_EXCEEDED


# -- keepalive ---------------------------------------------------------------------------------
def test_a_peer_that_does_not_answer_keepalive_pings_fails_open_streams_unavailable(h2):
    def script(peer):
        peer.next_stream()
        peer.wait_closed()

    server = h2.server(script)
    connection = h2.connection(server, keepalive_time=0.2, keepalive_timeout=0.2)
    started = time.monotonic()
    stream = connection.start("/etcdserverpb.Watch/Watch", (), None, WatchResponse.FromString, None)
    assert stream.done.acquire(timeout=WAIT)
    assert time.monotonic() - started < 2.0
    assert stream.code == grpc.StatusCode.UNAVAILABLE
    assert "keepalive" in stream.details
    assert not connection.usable
    assert server.peer(0).closed.wait(WAIT)
    assert len(server.peer(0).pings) >= 1 and all(len(payload) == 8 for payload in server.peer(0).pings)


def test_a_peer_that_answers_keepalive_pings_keeps_streams_open_and_idle_connections_are_not_pinged(h2):
    idle_over, pinged = threading.Event(), threading.Event()
    seen = {}

    def script(peer):
        peer.answer_pings = True
        peer.idle(0.5)
        seen["pings while idle"] = len(peer.pings)
        idle_over.set()
        peer.next_stream()
        peer.wait_until(lambda: len(peer.pings) >= 3, "three pings")
        pinged.set()
        peer.wait_closed()

    server = h2.server(script)
    connection = h2.connection(server, keepalive_time=0.2, keepalive_timeout=0.2)
    assert idle_over.wait(WAIT)
    stream = connection.start("/etcdserverpb.Watch/Watch", (), None, WatchResponse.FromString, None)
    assert pinged.wait(WAIT)
    assert stream.code is None and connection.usable
    assert seen["pings while idle"] == 0
    connection.reset(stream, grpc.StatusCode.CANCELLED, "done")
    assert stream.code == grpc.StatusCode.CANCELLED


# -- closing the channel -----------------------------------------------------------------------
def test_closing_the_channel_cancels_calls_in_flight_and_refuses_later_ones(h2):
    received = threading.Event()

    def script(peer):
        peer.read_request()
        received.set()
        peer.wait_closed()

    server = h2.server(script)
    channel = h2.channel(server)
    call = kv_range(channel)
    pending = h2.background(lambda: call(RangeRequest(), timeout=10))
    assert received.wait(WAIT)
    channel.close()
    error = pending.wait()
    assert isinstance(error, CallError) and error.code() == grpc.StatusCode.CANCELLED
    for attempt in (lambda: call(RangeRequest(), timeout=WAIT), lambda: watch(channel)(RequestQueue())):
        with pytest.raises(CallError) as caught:
            attempt()
        assert caught.value.code() == grpc.StatusCode.CANCELLED
    assert not channel.connected
    assert server.peer(0).closed.wait(WAIT)
    assert server.accepted == 1


# -- TLS ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def server_tls(files) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files.server_cert, files.server_key)
    context.set_alpn_protocols(["h2"])
    return context


def test_calls_and_a_busy_stream_work_over_tls(h2, tls_files):
    def script(peer):
        request = peer.read_request()
        peer.respond(request.id, RangeResponse(count=9).SerializeToString())
        stream = peer.next_stream()
        peer.send_headers(stream.id, RESPONSE_HEADERS)
        for number in range(50):  # while the client is still sending its requests
            peer.send_message(stream.id, WatchResponse(watch_id=number).SerializeToString())
        peer.wait_until(lambda: stream.ended, "the half-close")
        peer.send_message(stream.id, WatchResponse(watch_id=len(stream.messages)).SerializeToString())
        peer.send_trailers(stream.id)
        peer.wait_closed()

    server = h2.server(script, tls=server_tls(tls_files))
    channel = h2.channel(server, tls=tls_context(str(tls_files.ca_cert), None, None))
    assert kv_range(channel)(RangeRequest(), timeout=WAIT).count == 9
    requests = RequestQueue()
    call = watch(channel)(requests)
    reading = h2.background(lambda: [response.watch_id for response in call])
    for number in range(50):
        requests.put(watch_request(b"%d" % number))
    requests.put(None)
    assert reading.result() == list(range(50)) + [50]


def test_a_server_certificate_from_another_ca_fails_the_call_as_not_sent(h2, tls_files, tmp_path):
    other = make_tls_files(tmp_path / "other")
    server = h2.server(lambda peer: None, tls=server_tls(tls_files))
    channel = h2.channel(server, tls=tls_context(str(other.ca_cert), None, None))
    with pytest.raises(CallError) as caught:
        kv_range(channel)(RangeRequest(), timeout=WAIT)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert caught.value.details().startswith(NOT_SENT)
    assert "certificate verify failed" in caught.value.details()
