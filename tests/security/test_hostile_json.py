"""Finding 2 and 6: deeply nested, oversized or huge JSON is bad input (one line), never a traceback.

Each test replays the review's reproducer against the real code path: the record decoders, a
real store server on loopback (its log is captured), the store client against a hostile
server, and a worker's error file.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading

import pytest

from backends.errors import BackendError
from backends.tcp.client import TcpStoreBackend
from backends.tcp.config import TcpStoreConfig
from backends.tcp.protocol import MAGIC
from elastic.testing.agents import wait_until
from elastic.agent.processes.failures import read_error_file
from elastic.rendezvous.errors import RendezvousStateError
from elastic.rendezvous.records import FORMAT_VERSION, decode_closed, decode_join, decode_round
from elastic.testing.tcp_store import TcpStoreHarness
from hostile import NESTED, closed_by_peer, handshake, raw_socket

KEY = "/elastic/job/state/round"
SMALL_NESTED = b"[" * 3000 + b"]" * 3000
"""Deeper than the decoder's recursion limit, yet small enough for a pre-handshake frame."""


def assert_one_short_line(message: str, limit: int = 400) -> None:
    assert "\n" not in message
    assert len(message) <= limit, f"{len(message)} characters: {message[:200]}..."


@pytest.mark.parametrize("raw", [
    NESTED,
    b'{"v":%d,"round":0,"members":' % FORMAT_VERSION + NESTED + b'}',
    b'{"v":%d,"round":0,"members":[' % FORMAT_VERSION + NESTED + b'],"read_at":0}',
], ids=["bare", "as-members", "as-a-member"])
def test_deeply_nested_round_state_is_a_one_line_state_error(raw):
    with pytest.raises(RendezvousStateError) as caught:
        decode_round(KEY, raw)
    assert "corrupt" in str(caught.value) and KEY in str(caught.value)
    assert_one_short_line(str(caught.value))


@pytest.mark.parametrize("decode", [decode_join, decode_closed], ids=["join", "closed"])
def test_deeply_nested_join_and_closed_records_are_one_line_state_errors(decode):
    with pytest.raises(RendezvousStateError) as caught:
        decode(KEY, NESTED)
    assert_one_short_line(str(caught.value))


def test_a_huge_corrupt_member_entry_is_quoted_in_at_most_about_100_characters():
    entry = ["node", "x" * 1_000_000]  # two fields instead of five, one of them 1 MB
    raw = json.dumps({"v": FORMAT_VERSION, "round": 0, "members": [entry], "read_at": 0, "restarts": 0}).encode()
    with pytest.raises(RendezvousStateError) as caught:
        decode_round(KEY, raw)
    assert "member entry ['node', 'xxx" in str(caught.value)
    assert_one_short_line(str(caught.value))


def test_a_huge_unknown_format_version_is_quoted_short():
    raw = json.dumps({"v": "9" * 1_000_000}).encode()
    with pytest.raises(RendezvousStateError) as caught:
        decode_round(KEY, raw)
    assert_one_short_line(str(caught.value))


@pytest.fixture
def harness():
    harness = TcpStoreHarness()
    yield harness
    harness.close()


SERVER_LOGGERS = ("backends.tcp.store_server", "backends.tcp.peer")
"""The store server's loggers: its own (peer-caused lines go through it) and its connections'."""


def server_records(caplog):
    return [record for record in caplog.records if record.name in SERVER_LOGGERS]


def log_server_info(caplog) -> None:
    for name in SERVER_LOGGERS:
        caplog.set_level(logging.INFO, logger=name)


def test_nested_json_before_the_handshake_is_one_warning_line_and_the_store_keeps_serving(harness, caplog):
    log_server_info(caplog)
    with raw_socket(harness.port) as sock:
        sock.sendall(MAGIC + struct.pack("!II", 4 + len(SMALL_NESTED), len(SMALL_NESTED)) + SMALL_NESTED)
        assert closed_by_peer(sock)
    with harness.connect() as client:
        assert client.put("/alive", b"1") > 1

    def dropped_lines() -> list[logging.LogRecord]:
        return [record for record in server_records(caplog) if record.levelno >= logging.WARNING]

    # Peer-caused lines are written by the store's log thread (backends/tcp/peerlog.py), not inline.
    wait_until(dropped_lines, 5.0, "the store's warning about the nested frame")
    dropped = dropped_lines()
    assert len(dropped) == 1, [record.getMessage() for record in dropped]
    assert dropped[0].exc_info is None and "nested too deeply" in dropped[0].getMessage()
    assert_one_short_line(dropped[0].getMessage())


def test_nested_json_after_the_handshake_costs_only_that_connection_without_a_traceback(harness, caplog):
    log_server_info(caplog)
    sock = handshake(harness.port, harness.token)
    sock.sendall(struct.pack("!II", 4 + len(NESTED), len(NESTED)) + NESTED)
    assert closed_by_peer(sock)
    with harness.connect() as client:
        assert client.put("/alive", b"1") > 1
    wait_until(lambda: any("nested too deeply" in record.getMessage() for record in server_records(caplog)), 5.0,
               "the store's line about the nested frame (written by its log thread)")
    assert all(record.exc_info is None for record in server_records(caplog))


def test_the_client_turns_a_nested_reply_header_into_a_backend_error():
    """A hostile or broken server answers the handshake with nested JSON: one BackendError."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(MAGIC + struct.pack("!II", 4 + len(NESTED), len(NESTED)) + NESTED)
            conn.recv(1)  # until the client hangs up

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        config = TcpStoreConfig(f"127.0.0.1:{port}", connect_timeout=5.0, request_timeout=5.0)
        with pytest.raises(BackendError) as caught:
            TcpStoreBackend(config).connect()
        assert "nested too deeply" in str(caught.value)
    finally:
        listener.close()
        thread.join(5)


def test_a_nested_error_file_is_ignored_with_one_warning(tmp_path, caplog):
    path = tmp_path / "error.json"
    path.write_bytes(b'{"message":' + NESTED + b"}")
    with caplog.at_level(logging.WARNING, logger="elastic.agent.processes.failures"):
        assert read_error_file(str(path)) is None
    (warning,) = [record for record in caplog.records if record.name == "elastic.agent.processes.failures"]
    assert "nested too deeply" in warning.getMessage()
