"""The latency proxy fault tool: it delays each way, keeps the bytes and their order, and stops clean."""

from __future__ import annotations

import socket
import socketserver
import threading
import time

import pytest

from support.latency_proxy import LatencyProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address
    server.shutdown()
    server.server_close()


def exchange(address: str, payload: bytes) -> tuple[bytes, float]:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        started = time.monotonic()
        conn.sendall(payload)
        received = b""
        while len(received) < len(payload):
            chunk = conn.recv(65536)
            assert chunk, "the proxy closed the connection"
            received += chunk
        return received, time.monotonic() - started


def test_a_round_trip_through_the_proxy_costs_twice_the_delay_and_keeps_every_byte(echo):
    payload = bytes(range(256)) * 1024  # 256 KiB: several chunks, held in order
    with LatencyProxy(echo, delay=0.2) as proxy:
        received, took = exchange(proxy.address, payload)
        assert received == payload
        assert 0.4 <= took < 2.0
        proxy.set_delay(0.0)
        _, fast = exchange(proxy.address, b"x")
        assert fast < 0.2


def test_stopping_closes_its_connections_and_ends_its_thread(echo):
    proxy = LatencyProxy(echo, delay=0.05).start()
    host, port = proxy.address.rsplit(":", 1)
    conn = socket.create_connection((host, int(port)), timeout=5)
    try:
        conn.sendall(b"ping")
        assert conn.recv(4) == b"ping"
        proxy.stop()
        assert conn.recv(4) == b""  # closed by the proxy
        assert not proxy._thread.is_alive()
        proxy.stop()  # idempotent
    finally:
        conn.close()


def test_connections_beyond_the_bound_are_closed_at_once(echo):
    with LatencyProxy(echo, delay=0.0, max_connections=1) as proxy:
        host, port = proxy.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as first:
            first.sendall(b"a")
            assert first.recv(1) == b"a"
            with socket.create_connection((host, int(port)), timeout=5) as second:
                second.sendall(b"b")
                try:
                    assert second.recv(1) == b""  # closed, not forwarded
                except ConnectionResetError:
                    pass  # closed with our byte unread: a reset
