"""Finding 4: the metrics server listens on loopback unless told otherwise, gives each request
a whole-request deadline (a byte every few seconds does not hold a thread), and caps its
connections."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from prometheus_client import CollectorRegistry

from elastic.agent.observe.metrics_server import MetricsServer
from elastic.testing.agents import wait_until


def test_the_metrics_server_listens_on_loopback_by_default():
    with MetricsServer(0, registry=CollectorRegistry()) as server:
        assert server._server.server_address[0] == "127.0.0.1"  # noqa: SLF001 - the bound socket


def drip(port: int, seconds: float, interval: float) -> float | None:
    """Send a request one byte per ``interval``; when the server hung up (None: not within ``seconds``)."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        request = b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 10_000
        for byte in request:
            if time.monotonic() - start > seconds:
                return None
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                return time.monotonic() - start
            sock.settimeout(interval)
            try:
                if sock.recv(1) == b"":
                    return time.monotonic() - start
            except TimeoutError:
                pass
            except OSError:
                return time.monotonic() - start
    return None


def test_a_client_dripping_one_byte_at_a_time_is_cut_off_at_the_request_deadline():
    with MetricsServer(0, registry=CollectorRegistry(), request_deadline=1.0) as server:
        hung_up_after = drip(server.port, seconds=6.0, interval=0.2)
    assert hung_up_after is not None and hung_up_after < 4.0, hung_up_after


@pytest.mark.slow
def test_with_the_default_deadline_a_byte_every_two_seconds_is_cut_off_after_about_ten_seconds():
    with MetricsServer(0, registry=CollectorRegistry()) as server:
        hung_up_after = drip(server.port, seconds=16.0, interval=2.0)
    assert hung_up_after is not None and hung_up_after < 14.0, hung_up_after


def test_connections_beyond_the_cap_are_closed_at_once_and_threads_stay_bounded():
    threads_before = threading.active_count()
    with MetricsServer(0, registry=CollectorRegistry(), max_connections=4, request_deadline=3.0) as server:
        idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(4)]
        wait_until(lambda: threading.active_count() >= threads_before + 1 + 4, 5, "a thread per idle connection")
        extra = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(20)]
        try:
            for sock in extra:
                assert sock.recv(1) == b""  # closed without a thread
            assert threading.active_count() <= threads_before + 1 + 4
        finally:
            for sock in idle + extra:
                sock.close()
        # Once the idle ones are gone, the server answers again.
        def answers() -> bool:
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
                sock.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
                return sock.recv(12).startswith(b"HTTP/1.0 200")
        wait_until(answers, 10, "the server to answer /healthz again")
