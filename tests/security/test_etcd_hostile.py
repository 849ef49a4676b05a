"""A hostile or broken etcd endpoint against our grpcio client: one clear line, bounded memory.

The servers here are real: a grpcio server implementing etcd's KV service (the ``etcd3``
package's generated ``KVServicer``) that answers with an oversized response, with a megabyte
of headers, or never answers,
a gRPC server without etcd's services, and plain TCP sockets that speak no HTTP/2. The client
whose memory is measured runs in its own process, so only its own allocations count.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from etcd3 import etcdrpc
from etcd3.etcdrpc import kv_pb2

from backends.errors import BackendConnectionError, BackendError, BackendTimeoutError, ProtocolError
from backends.etcd import EtcdBackend, EtcdConfig

from hostile import REPO

MIB = 1024 * 1024
HUGE_RESPONSE_MIB = 96
"""What the hostile server answers a prefix read with: 96 values of 1 MiB in one response."""
CLIENT_LIMIT_MIB = 4


class HostileKV(etcdrpc.KVServicer):
    """etcd's KV service that answers ``/small`` normally and any other range as ``mode`` says."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.released = threading.Event()

    def Range(self, request, context):  # noqa: N802 (gRPC's method name)
        header = etcdrpc.ResponseHeader(revision=7)
        if request.key == b"/small":
            return etcdrpc.RangeResponse(header=header)
        if self.mode == "silent":
            self.released.wait(30)
            return etcdrpc.RangeResponse(header=header)
        if self.mode == "headers":
            context.set_trailing_metadata(tuple((f"x-pad-{i}", "a" * 8000) for i in range(128)))  # 1 MiB
            return etcdrpc.RangeResponse(header=header)
        value = b"x" * MIB
        kvs = [kv_pb2.KeyValue(key=b"/big/%d" % i, value=value, mod_revision=7) for i in range(HUGE_RESPONSE_MIB)]
        return etcdrpc.RangeResponse(header=header, kvs=kvs, count=len(kvs))


class GrpcServer:
    """A grpcio server on a free loopback port with the given servicer (or none), stopped on exit."""

    def __init__(self, servicer: HostileKV | None) -> None:
        self.servicer = servicer
        self.server = grpc.server(ThreadPoolExecutor(4), options=[("grpc.max_send_message_length", -1)])
        if servicer is not None:
            etcdrpc.add_KVServicer_to_server(servicer, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"127.0.0.1:{self.port}"
        self.server.start()

    def __enter__(self) -> "GrpcServer":
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.servicer is not None:
            self.servicer.released.set()
        self.server.stop(0).wait(5)


class GarbageServer:
    """A TCP listener that answers every connection with bytes that are not HTTP/2, then closes it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.endpoint = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                try:
                    conn.sendall(b"\x00\xff garbage, not a SETTINGS frame \xfe" * 64)
                    conn.recv(65536)
                except OSError:
                    pass

    def __enter__(self) -> "GarbageServer":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.listener.close()


CLIENT = """
import json, sys
from backends.etcd import EtcdBackend, EtcdConfig

def peak_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))

backend = EtcdBackend(EtcdConfig(sys.argv[1], request_timeout=10.0, max_response_bytes=int(sys.argv[2])))
backend.get("/small")  # connected, every client thread started
before = peak_kib()
try:
    backend.get_prefix("/big/")
    outcome = {"error": None}
except Exception as error:
    outcome = {"error": type(error).__name__, "message": str(error)}
outcome["growth_kib"] = peak_kib() - before
backend.close()
print(json.dumps(outcome))
"""


def run_client(endpoint: str, limit_bytes: int) -> dict:
    done = subprocess.run([sys.executable, "-c", CLIENT, endpoint, str(limit_bytes)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_one_clear_line(error: BaseException, endpoint: str) -> None:
    message = str(error)
    assert "\n" not in message and "Traceback" not in message
    assert endpoint in message


def test_a_response_above_the_client_limit_fails_in_one_line_without_buffering_it():
    with GrpcServer(HostileKV("huge")) as server:
        outcome = run_client(server.endpoint, CLIENT_LIMIT_MIB * MIB)
    assert outcome["error"] == "ProtocolError", outcome
    assert_one_clear_line(Exception(outcome["message"]), server.endpoint)
    assert "max_response_bytes" in outcome["message"]
    # The 96 MiB answer is refused from its length, not held: the client's peak grows by far
    # less than the response (a few MiB of buffers at most).
    assert outcome["growth_kib"] < 24 * 1024, outcome


def test_the_same_response_is_read_when_the_limit_allows_it():
    # The control for the test above: the server really sends 96 MiB, and a client allowed
    # 128 MiB holds it (so the bound, not a broken server, is what stopped the first client).
    with GrpcServer(HostileKV("huge")) as server:
        outcome = run_client(server.endpoint, 128 * MIB)
    assert outcome["error"] is None, outcome
    assert outcome["growth_kib"] > HUGE_RESPONSE_MIB * 1024, outcome


def test_a_megabyte_of_response_headers_is_refused_in_one_line_naming_the_endpoint():
    with GrpcServer(HostileKV("headers")) as server:
        with EtcdBackend(EtcdConfig(server.endpoint, request_timeout=2.0, dial_timeout=1.0)) as backend:
            with pytest.raises(ProtocolError) as raised:
                backend.get("/k")
    assert_one_clear_line(raised.value, server.endpoint)
    assert "headers larger than this client accepts" in str(raised.value)


def test_a_server_that_never_answers_gives_a_timeout_naming_the_endpoint_within_the_deadline():
    with GrpcServer(HostileKV("silent")) as server:
        with EtcdBackend(EtcdConfig(server.endpoint, request_timeout=1.0, dial_timeout=1.0)) as backend:
            backend.get("/small")
            started = time.monotonic()
            with pytest.raises(BackendTimeoutError) as raised:
                backend.get("/k")
            elapsed = time.monotonic() - started
    assert elapsed < 3.0
    assert_one_clear_line(raised.value, server.endpoint)
    assert "request_timeout" in str(raised.value)


def test_a_grpc_server_without_etcds_services_is_a_protocol_error_that_says_so():
    with GrpcServer(None) as server:
        with EtcdBackend(EtcdConfig(server.endpoint, request_timeout=2.0, dial_timeout=1.0)) as backend:
            with pytest.raises(ProtocolError) as raised:
                backend.get("/k")
    assert_one_clear_line(raised.value, server.endpoint)
    assert "etcd v3 API" in str(raised.value)


def test_a_tcp_server_that_sends_garbage_gives_one_line_naming_the_endpoint_not_a_hang():
    with GarbageServer() as server:
        with EtcdBackend(EtcdConfig(server.endpoint, request_timeout=2.0, dial_timeout=1.0)) as backend:
            started = time.monotonic()
            with pytest.raises(BackendError) as raised:
                backend.get("/k")
            elapsed = time.monotonic() - started
    assert elapsed < 4.0
    assert isinstance(raised.value, (ProtocolError, BackendConnectionError)), raised.value
    assert_one_clear_line(raised.value, server.endpoint)
    assert "etcd" in str(raised.value)
