"""Behaviour of the built-in TCP store beyond the contract: real server, real loopback sockets."""

import http.server
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from backends.api import EventType
from backends.errors import (
    BackendAuthError,
    BackendConnectionError,
    BackendTimeoutError,
    CompactedError,
    EndpointError,
    ProtocolError,
    ValueTooLargeError,
)
from backends.tcp.client import TcpStoreBackend
from backends.tcp.config import TcpStoreConfig
from backends.tcp.protocol import MAGIC, PROTOCOL_VERSION, FrameDecoder, encode_frame
from backends.tcp.server import start_server
from elastic.testing.contract.fixtures import collect_events
from elastic.testing.tcp_store import TcpStoreHarness

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def harness():
    harness = TcpStoreHarness()
    yield harness
    harness.close()


@pytest.fixture
def client(harness):
    with harness.connect() as client:
        yield client


@pytest.fixture
def prefix():
    return f"/tcp/{uuid.uuid4().hex[:12]}/"


def raw_connection(harness, token=None, handshake=True):
    sock = socket.create_connection(("127.0.0.1", harness.port), timeout=5)
    if handshake:
        sock.sendall(MAGIC + encode_frame({"v": PROTOCOL_VERSION, "token": harness.token if token is None else token}))
        assert sock.recv(len(MAGIC), socket.MSG_WAITALL) == MAGIC
        decoder = FrameDecoder()
        while not decoder.feed(sock.recv(65536)):
            pass
    return sock


def assert_dropped(sock):
    """The server closes ``sock`` (EOF or reset) rather than hanging or crashing."""
    sock.settimeout(5)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    finally:
        sock.close()


def assert_store_serves(harness, prefix):
    with harness.connect() as other:
        revision = other.put(prefix + "alive", b"yes")
        assert other.get(prefix + "alive").kv.mod_revision == revision


# -- a bad peer costs only its own connection -------------------------------------------------
@pytest.mark.parametrize(
    "payload",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        MAGIC + struct.pack("!II", 2**31, 4),  # oversized hello frame
        MAGIC + b"\x00\x00\x00\x10\x00\x00\x00\x0c{not json!!}",
        os.urandom(4096),
    ],
    ids=["http", "oversized-hello", "bad-json-hello", "random-bytes"],
)
def test_garbage_before_the_handshake_drops_only_that_connection(harness, prefix, payload):
    with harness.connect() as bystander:
        bystander.put(prefix + "before", b"1")
        sock = raw_connection(harness, handshake=False)
        sock.sendall(payload)
        assert_dropped(sock)
        assert bystander.get(prefix + "before").kv.value == b"1"
    assert_store_serves(harness, prefix)


@pytest.mark.parametrize(
    "payload",
    [
        struct.pack("!II", 2**31, 4),  # oversized frame length
        struct.pack("!II", 14, 10) + b"{garbage!}",  # header is not JSON
        encode_frame({"op": "get", "k": "no request id"}),
    ],
    ids=["oversized", "bad-json", "no-request-id"],
)
def test_garbage_after_the_handshake_drops_only_that_connection(harness, prefix, payload):
    sock = raw_connection(harness)
    sock.sendall(payload)
    assert_dropped(sock)
    assert_store_serves(harness, prefix)


def test_half_frames_then_disconnects_do_not_hurt_the_server(harness, prefix):
    hello = MAGIC + encode_frame({"v": PROTOCOL_VERSION, "token": harness.token})
    raw_connection(harness, handshake=False).sendall(hello[: len(hello) // 2])
    sock = raw_connection(harness)
    request = encode_frame({"op": "put", "k": prefix + "half", "i": 1}, (b"x" * 1000,))
    sock.sendall(request[:500])
    sock.close()
    assert_store_serves(harness, prefix)
    with harness.connect() as other:
        assert other.get(prefix + "half").kv is None


def test_a_request_with_wrong_field_types_gets_an_error_reply_and_the_connection_lives(harness, prefix):
    sock = raw_connection(harness)
    decoder = FrameDecoder()
    sock.sendall(encode_frame({"op": "get", "k": 5, "i": 1}) + encode_frame({"op": "nope", "i": 2}))
    sock.sendall(encode_frame({"op": "get", "k": prefix, "i": 3}))
    frames = []
    while len(frames) < 3:
        frames.extend(decoder.feed(sock.recv(65536)))
    sock.close()
    assert [frame.header.get("err") for frame in frames] == ["protocol", "protocol", None]
    assert frames[2].header["kv"] is None


def test_a_client_that_never_completes_the_handshake_is_dropped():
    harness = TcpStoreHarness(handshake_timeout=0.2)
    try:
        sock = raw_connection(harness, handshake=False)
        started = time.monotonic()
        assert_dropped(sock)
        assert time.monotonic() - started < 3
    finally:
        harness.close()


# -- authentication and peers that are not a store --------------------------------------------
@pytest.mark.parametrize("token", ["wrong-token", None], ids=["wrong", "missing"])
def test_a_wrong_or_missing_token_is_an_auth_error(harness, token):
    client = TcpStoreBackend(TcpStoreConfig(harness.endpoint, token=token))
    with pytest.raises(BackendAuthError, match="token"):
        client.get("/k")
    client.close()


def test_a_store_without_a_token_accepts_any_client(prefix):
    with start_server() as handle:
        for token in (None, "anything"):
            with TcpStoreBackend(TcpStoreConfig(handle.endpoint, token=token)) as client:
                assert client.put(prefix + "k", b"v") > 0


def test_talking_to_an_http_server_is_a_protocol_error():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = TcpStoreBackend(TcpStoreConfig(f"127.0.0.1:{server.server_address[1]}", connect_timeout=5))
        started = time.monotonic()
        with pytest.raises(ProtocolError, match="not an elastic-store"):
            client.get("/k")
        assert time.monotonic() - started < 2
        client.close()
    finally:
        server.shutdown()
        server.server_close()


def test_a_peer_that_never_answers_times_out_instead_of_hanging():
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        client = TcpStoreBackend(TcpStoreConfig(f"127.0.0.1:{listener.getsockname()[1]}", connect_timeout=0.3))
        started = time.monotonic()
        with pytest.raises(BackendTimeoutError):
            client.get("/k")
        assert time.monotonic() - started < 2
        client.close()
    finally:
        listener.close()


def test_nothing_listening_is_a_connection_error():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
    client = TcpStoreBackend(TcpStoreConfig(f"127.0.0.1:{port}"))
    with pytest.raises(BackendConnectionError):
        client.get("/k")
    client.close()


@pytest.mark.parametrize(
    "options, error",
    [
        ({"endpoint": "https://127.0.0.1:1"}, EndpointError),
        ({"endpoint": "no port:x"}, EndpointError),
        ({"endpoint": "127.0.0.1:1", "request_timeout": 0}, ValueError),
    ],
)
def test_bad_client_settings_are_rejected_at_once(options, error):
    with pytest.raises(error):
        TcpStoreConfig(**options)


# -- many threads, one connection -------------------------------------------------------------
def test_16_threads_doing_200_mixed_operations_each_all_get_correct_answers(client, prefix):
    def worker(index):
        key = f"{prefix}{index}"
        for step in range(40):
            value = f"{index}-{step}".encode()
            revision = client.put(key, value)
            read = client.get(key)
            assert read.kv.value == value and read.kv.mod_revision == revision
            updated = client.put_if(key, value + b"!", revision)
            assert updated.applied and updated.current.value == value + b"!"
            assert not client.put_if(key, b"stale", revision).applied
            assert client.delete_if(key, updated.revision).applied
        return index

    with ThreadPoolExecutor(16) as pool:
        assert sorted(pool.map(worker, range(16))) == list(range(16))
    assert client.get_prefix(prefix).kvs == ()


def test_a_value_over_the_servers_limit_is_refused_by_the_server_too(harness, prefix):
    with harness.connect() as client:
        client.max_value_bytes = 10 * 1024 * 1024  # skip the client-side check
        with pytest.raises(ValueTooLargeError):
            client.put(prefix + "big", b"x" * (harness.state.max_value_bytes + 1))
        assert client.get(prefix + "big").kv is None


# -- failures of the server under a client ----------------------------------------------------
def test_an_unresponsive_server_gives_a_timeout_within_the_request_timeout(harness, prefix):
    with harness.connect(request_timeout=0.5) as client:
        client.put(prefix + "k", b"v")
        harness._handle.freeze(1.5)
        started = time.monotonic()
        with pytest.raises(BackendTimeoutError):
            client.get(prefix + "k")
        assert time.monotonic() - started < 1.0
        time.sleep(1.2)
        assert client.get(prefix + "k").kv.value == b"v"


def test_a_request_pending_when_the_server_stops_fails_promptly(harness, prefix):
    with harness.connect(request_timeout=30) as client:
        client.put(prefix + "k", b"v")
        harness._handle.freeze(0.5)
        outcome = {}

        def pending_get():
            started = time.monotonic()
            try:
                client.get(prefix + "k")
            except BackendConnectionError as error:
                outcome["error"] = error
            outcome["elapsed"] = time.monotonic() - started

        thread = threading.Thread(target=pending_get)
        thread.start()
        time.sleep(0.1)
        harness.stop_server()
        thread.join(10)
        assert isinstance(outcome.get("error"), BackendConnectionError)
        assert outcome["elapsed"] < 3


def test_a_dropped_connection_resumes_watches_without_losing_or_repeating_events(harness, prefix):
    with harness.connect() as watcher, watcher.watch_prefix(prefix) as watch:
        watcher.put(prefix + "1", b"a")
        first = collect_events(watch, 1, timeout=5)
        harness._handle.drop_connections()
        with harness.connect() as writer:  # written while the watcher is reconnecting
            writer.put(prefix + "2", b"b")
            writer.delete(prefix + "1")
        rest = collect_events(watch, 2, timeout=5)
        assert watch.get(timeout=0.2) == []
        assert watcher.get(prefix + "2").kv.value == b"b"  # the watcher's client reconnected
    assert [(event.type, event.kv.key) for event in first + rest] == [
        (EventType.PUT, prefix + "1"),
        (EventType.PUT, prefix + "2"),
        (EventType.DELETE, prefix + "1"),
    ]


def test_a_restarted_store_with_its_state_resumes_watches():
    harness = TcpStoreHarness(keep_state=True)
    prefix = "/tcp/resume/"
    try:
        with harness.connect() as client, client.watch_prefix(prefix) as watch:
            client.put(prefix + "a", b"1")
            first = collect_events(watch, 1, timeout=5)
            harness.stop_server()
            harness.start_server()
            with harness.connect() as writer:
                writer.put(prefix + "b", b"2")
            rest = collect_events(watch, 1, timeout=10)
        assert [event.kv.key for event in first + rest] == [prefix + "a", prefix + "b"]
    finally:
        harness.close()


def test_a_watch_keeps_resuming_past_its_resume_timeout_until_the_store_is_back(caplog):
    # An outage never ends a watch: the resume timeout only spaces the warnings.
    harness = TcpStoreHarness(keep_state=True)
    prefix = "/tcp/outlive/"
    try:
        with TcpStoreBackend(harness.config(request_timeout=0.5, connect_timeout=0.5,
                                            watch_resume_timeout=0.5)) as client, client.watch_prefix(prefix) as watch:
            client.put(prefix + "a", b"1")
            assert len(collect_events(watch, 1, timeout=5)) == 1
            harness.stop_server()
            with caplog.at_level(logging.WARNING, logger="backends.tcp.client"):
                assert watch.get(timeout=2.0) == []  # four resume timeouts without the store
            harness.start_server()
            with harness.connect() as writer:
                revision = writer.put(prefix + "b", b"2")
            assert [event.revision for event in collect_events(watch, 1, timeout=10)] == [revision]
        assert "still resuming" in caplog.text
    finally:
        harness.close()


def test_a_restarted_store_with_fresh_state_fails_live_watches_saying_so(harness, prefix):
    with harness.connect() as client:
        watch = client.watch_prefix(prefix)
        client.put(prefix + "a", b"1")
        assert len(collect_events(watch, 1, timeout=5)) == 1
        harness.stop_server()
        harness.start_server()
        with pytest.raises(CompactedError, match="restarted with fresh state") as raised:
            collect_events(watch, 1, timeout=10)
        assert raised.value.requested_revision > 1
        with watch:
            pass
        assert client.put(prefix + "b", b"2") > 0


def test_lease_expiry_is_pushed_within_ttl_plus_a_fraction_of_a_second(client, prefix):
    lease = client.grant(0.4)
    granted = time.monotonic()
    client.put(prefix + "ephemeral", b"v", lease=lease.id)
    with client.watch_prefix(prefix) as watch:
        events = collect_events(watch, 1, timeout=3)
    elapsed = time.monotonic() - granted
    assert [event.type for event in events] == [EventType.DELETE]
    assert elapsed <= 0.4 + 0.2, f"DELETE seen {elapsed:.3f}s after grant"


def test_closing_the_client_wakes_a_blocked_watch_reader(client, prefix):
    watch = client.watch_prefix(prefix)
    errors = []

    def read():
        try:
            watch.get(timeout=10)
        except Exception as error:  # noqa: BLE001 - the assertion names the type
            errors.append(error)

    thread = threading.Thread(target=read)
    thread.start()
    time.sleep(0.1)
    client.close()
    thread.join(5)
    assert not thread.is_alive() and type(errors[0]).__name__ == "BackendClosedError"


# -- the elastic-store command ------------------------------------------------------------------
def run_store(*args):
    return subprocess.Popen(
        [sys.executable, "-m", "backends.tcp.cli", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_cli_prints_its_address_serves_and_exits_0_on_sigterm(tmp_path, prefix):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    process = run_store("--host", "127.0.0.1", "--port", "0", "--token-file", str(token_file))
    try:
        line = process.stdout.readline().strip()
        assert line.startswith("elastic-store listening on 127.0.0.1:")
        endpoint = line.rsplit(" ", 1)[1]
        with TcpStoreBackend(TcpStoreConfig(endpoint, token="s3cret")) as client:
            revision = client.put(prefix + "k", b"v")
            assert client.get(prefix + "k").kv.mod_revision == revision
        with pytest.raises(BackendAuthError):
            TcpStoreBackend(TcpStoreConfig(endpoint, token="wrong")).connect()
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--port", "http"], "port"),
        (["--bogus"], "unrecognized arguments"),
        (["--token-file", "/nonexistent/token"], "cannot read the token file"),
    ],
)
def test_the_cli_rejects_bad_settings_with_one_line_and_exit_2(args, message):
    process = run_store(*args)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 2
    assert len(stderr.strip().splitlines()) == 1 and message in stderr


def test_a_request_over_the_frame_limit_is_refused_before_sending_and_the_connection_lives(prefix):
    harness = TcpStoreHarness(max_frame_bytes=64 * 1024)
    try:
        with harness.connect() as client:
            with pytest.raises(ValueTooLargeError, match="frame limit"):
                client.put(prefix + "k" * 100_000, b"v")
            assert client.put(prefix + "small", b"v") > 0
    finally:
        harness.close()


def test_a_peer_of_protocol_version_1_is_refused_in_the_handshake_naming_both_versions(harness):
    """Version 1's put_if / put_claim ops are gone: an old client learns it at connect, not at its first write."""
    sock = raw_connection(harness, handshake=False)
    sock.sendall(MAGIC + encode_frame({"v": 1, "token": harness.token}))
    assert sock.recv(len(MAGIC), socket.MSG_WAITALL) == MAGIC
    decoder = FrameDecoder()
    frames = []
    while not frames:
        chunk = sock.recv(65536)
        assert chunk, "the store hung up without saying why"
        frames = decoder.feed(chunk)
    sock.close()
    assert frames[0].header["err"] == "version"
    assert f"version {PROTOCOL_VERSION}, the client 1" in frames[0].header["msg"]
