"""Finding 3: the built-in store's memory is bounded for everything a peer can send.

Each test runs ``elastic-store`` in its own process on loopback with default limits (except
where a test says), replays the review's reproducer, and measures the server's resident
memory (VmRSS) where the finding was about memory. Every refusal reaches the client as an
error it can read.
"""

from __future__ import annotations

import json
import resource
import secrets
import socket
import struct

import pytest

from backends.errors import BackendConnectionError, LimitExceededError, ValueTooLargeError
from backends.tcp.client import TcpStoreBackend
from backends.tcp.config import TcpStoreConfig
from backends.tcp.protocol import PROTOCOL_VERSION, FrameDecoder, encode_frame
from elastic.testing.agents import wait_until
from hostile import StoreProcess, handshake, raw_socket

MiB = 1024 * 1024


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(secrets.token_hex(16))
    return path


def client(store: StoreProcess, token_file) -> TcpStoreBackend:
    config = TcpStoreConfig(f"127.0.0.1:{store.port}", token=token_file.read_text(), request_timeout=30.0)
    return TcpStoreBackend(config).connect()


def first_frame(sock: socket.socket, timeout: float = 5.0):
    """The first frame the store sends on ``sock`` (None if it sends none in time)."""
    sock.settimeout(timeout)
    decoder = FrameDecoder()
    try:
        while chunk := sock.recv(65536):
            frames = decoder.feed(chunk)
            if frames:
                return frames[0]
    except (TimeoutError, ConnectionResetError):
        pass
    return None


def send_quietly(sock: socket.socket, data: bytes) -> None:
    """Send ``data``; a store that hung up stops the sending (that is the point)."""
    try:
        sock.sendall(data)
    except OSError:
        pass


@pytest.mark.slow
def test_four_clients_announcing_64_mib_frames_are_refused_from_the_length_prefix(token_file):
    with StoreProcess(token_file=token_file) as store:
        before = store.rss_bytes()
        socks = [handshake(store.port, token_file.read_text()) for _ in range(4)]
        chunk = b"x" * (4 * MiB)
        replies = []
        for sock in socks:
            sock.sendall(struct.pack("!II", 64 * MiB, 100))  # a 64 MiB frame is coming
            replies.append(first_frame(sock, timeout=2.0))
            for _ in range(15):  # then 60 MiB of it, unless the store hung up
                send_quietly(sock, chunk)
        grown = store.rss_bytes() - before
        for sock in socks:
            sock.close()
        assert store.alive()
    for reply in replies:
        assert reply is not None and reply.header["err"] == "too_large", reply
        assert "limit" in reply.header["msg"]
    assert grown < 32 * MiB, f"the store grew by {grown / MiB:.0f} MiB"


def test_a_header_over_the_limit_is_refused_before_it_is_read_or_parsed(token_file):
    with StoreProcess(token_file=token_file) as store:
        sock = handshake(store.port, token_file.read_text())
        sock.sendall(struct.pack("!II", 1 * MiB, 600 * 1024) + b'{"op":"get","k":"')  # 600 KiB of header
        reply = first_frame(sock)
        sock.close()
        with client(store, token_file) as other:
            assert other.put("/alive", b"1") > 1
    assert reply is not None and reply.header["err"] == "too_large"
    assert "header" in reply.header["msg"] and "262144" in reply.header["msg"]


@pytest.mark.slow
def test_overwriting_a_1_mib_value_150_times_keeps_the_history_bounded(token_file):
    with StoreProcess(token_file=token_file) as store:
        with client(store, token_file) as writer:
            writer.put("/big", b"0")
            before = store.rss_bytes()
            for index in range(150):
                writer.put("/big", bytes([index % 256]) * MiB)
            grown = store.rss_bytes() - before
    # 64 MiB of history by default, plus the live value and a few frames in flight; main: 178 MB.
    assert grown < 100 * MiB, f"the store grew by {grown / MiB:.0f} MiB"


def test_a_key_over_the_limit_is_refused_with_an_error_naming_the_limit(token_file):
    with StoreProcess(token_file=token_file) as store, client(store, token_file) as writer:
        with pytest.raises(ValueTooLargeError, match="8192"):
            writer.put("/" + "k" * 9000, b"v")
        with pytest.raises(ValueTooLargeError, match="limit"):
            writer.put("/" + "k" * 10 * MiB, b"v")  # over the request limit: refused before sending
        assert writer.get_prefix("/k").kvs == ()
        assert writer.put("/ok", b"v") > 1


def test_watches_beyond_the_per_connection_limit_are_refused(token_file):
    with StoreProcess(token_file=token_file) as store:
        sock = handshake(store.port, token_file.read_text())
        sock.sendall(b"".join(encode_frame({"i": i, "op": "watch", "p": f"/w/{i}/"}) for i in range(1, 4201)))
        decoder = FrameDecoder()
        replies = []
        sock.settimeout(10)
        while len(replies) < 4200:
            chunk = sock.recv(65536)
            assert chunk, "the store hung up"
            replies.extend(decoder.feed(chunk))
        sock.close()
    refused = [frame.header for frame in replies if "err" in frame.header]
    assert len(refused) == 4200 - 4096
    assert refused[0]["err"] == "limit" and "--max-watches-per-connection" in refused[0]["msg"]


def test_the_client_reports_the_watch_limit_as_limit_exceeded(token_file):
    with StoreProcess("--max-watches-per-connection", "3", token_file=token_file) as store:
        with client(store, token_file) as watcher:
            watches = [watcher.watch_prefix(f"/w/{i}/") for i in range(3)]
            with pytest.raises(LimitExceededError, match="3 watches"):
                watcher.watch_prefix("/w/3/")
            for watch in watches:
                watch.cancel()


@pytest.mark.slow
def test_idle_connections_that_never_authenticate_cost_little_and_lock_nobody_out(token_file):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < min(hard, 2400):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 2400), hard))
    count = min(2000, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 200)  # main: +48 KB each
    with StoreProcess(token_file=token_file) as store:
        before = store.rss_bytes()
        idle = []
        try:
            for _ in range(count):
                idle.append(raw_socket(store.port))
            wait_until(lambda: sum(not _open(sock) for sock in idle[:100]) == 100, 10,
                       "the store to close the 100 oldest idle connections")
            grown = store.rss_bytes() - before
            with client(store, token_file) as other:  # evicts the oldest idle handshake
                assert other.put("/alive", b"1") > 1
        finally:
            for sock in idle:
                sock.close()
    assert grown < 16 * MiB, f"the store grew by {grown / MiB:.0f} MiB for {count} idle connections"


def _open(sock: socket.socket) -> bool:
    """Whether the store still holds ``sock`` open (no EOF or reset waiting)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def test_connections_beyond_the_limit_get_a_busy_error_naming_the_flag(token_file):
    with StoreProcess("--max-connections", "4", "--max-pending-connections", "2", token_file=token_file) as store:
        held = [client(store, token_file) for _ in range(4)]
        try:
            with pytest.raises(BackendConnectionError, match="--max-connections"):
                client(store, token_file)
        finally:
            for other in held:
                other.close()
        wait_until(lambda: _connects(store, token_file), 10, "the store to accept a client again")


def _connects(store, token_file) -> bool:
    try:
        client(store, token_file).close()
        return True
    except BackendConnectionError:
        return False


@pytest.mark.slow
def test_a_watcher_that_never_reads_is_dropped_before_its_queue_grows_large(token_file):
    with StoreProcess(token_file=token_file) as store:
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        slow.connect(("127.0.0.1", store.port))
        slow.sendall(b"ESTORE1\n" + encode_frame({"v": PROTOCOL_VERSION, "token": token_file.read_text()}))
        slow.sendall(encode_frame({"i": 1, "op": "watch", "p": "/flood/"}))
        with client(store, token_file) as writer:
            before = store.rss_bytes()
            for index in range(100):
                writer.put(f"/flood/{index % 4}", b"x" * MiB)
            grown = store.rss_bytes() - before
        # Its queue is cut at 16 MiB: the watcher gets far less than the 100 MiB written, then EOF.
        received = 0
        slow.settimeout(5)
        dropped = False
        try:
            while chunk := slow.recv(1 << 20):
                received += len(chunk)
            dropped = True
        except ConnectionResetError:
            dropped = True
        except TimeoutError:
            pass
        finally:
            slow.close()
    assert dropped and received < 40 * MiB, f"read {received / MiB:.0f} MiB, dropped={dropped}"
    assert grown < 110 * MiB, f"the store grew by {grown / MiB:.0f} MiB"


def test_a_client_request_over_the_header_limit_fails_with_the_stores_reason_and_the_client_recovers():
    from backends.tcp.limits import StoreLimits
    from elastic.testing.tcp_store import TcpStoreHarness

    harness = TcpStoreHarness(limits=StoreLimits(max_header_bytes=1024))
    try:
        with harness.connect() as store:
            with pytest.raises(ValueTooLargeError, match="header of .* bytes is over the 1024-byte limit"):
                store.get("/" + "k" * 2000)
            assert store.put("/after", b"1") > 1  # reconnected
    finally:
        harness.close()


def _txn_replies(sock: socket.socket, requests: list[tuple[dict, bytes]]) -> list:
    """Send each txn request (header ``t`` field, payload) on ``sock``; return the replies in order."""
    for number, (item, payload) in enumerate(requests, 1):
        head = json.dumps({"i": number, "op": "txn", "t": item}).encode()
        sock.sendall(struct.pack("!II", 4 + len(head) + len(payload), len(head)) + head + payload)
    decoder = FrameDecoder()
    replies: list = []
    sock.settimeout(20)
    while len(replies) < len(requests):
        chunk = sock.recv(65536)
        assert chunk, "the store hung up"
        replies.extend(decoder.feed(chunk))
    return replies


def test_hostile_transactions_get_one_clear_error_each_and_cost_the_store_nothing(token_file):
    deep: dict = {"s": [["r", "/k", False, False]]}
    for _ in range(100):  # nested far beyond the limit, within what JSON decodes
        deep = {"s": [["t", deep]]}
    both_branches = {"s": [["p", "/dup", 0, 0]], "f": [["p", "/dup", 0, 0]]}
    paths = {"s": [["t", both_branches]] * 128}  # 2**128 write paths if each were walked
    wide = {"s": [["t", {"s": [["d", "/k", True]] * 128}]] * 9}
    requests = [
        (deep, b""),
        (wide, b""),
        (paths, b""),
        ({"s": [["p", "/k", 0, 10]]}, b"short"),
        ({"s": [["p", "/k", 0, 1]]}, b"too long"),
        ({"c": [["/k", "c", "==", 0]], "s": [["p", "/ok", 0, 2]]}, b"ok"),
    ]
    with StoreProcess(token_file=token_file) as store:
        sock = handshake(store.port, token_file.read_text())
        replies = [frame.header for frame in _txn_replies(sock, requests)]
        sock.close()
        assert store.alive()
        with client(store, token_file) as reader:
            assert reader.get("/ok").kv.value == b"ok" and reader.get_prefix("/dup").kvs == ()
    assert [reply.get("err") for reply in replies] == ["protocol", "protocol", "invalid", "protocol", "protocol", None]
    assert "more than 8 deep" in replies[0]["msg"] and "1024" in replies[1]["msg"]
    assert "twice" in replies[2]["msg"] and "payload" in replies[3]["msg"] and "carries 8" in replies[4]["msg"]
    assert replies[5]["ok"] is True
