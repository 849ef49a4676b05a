"""The agent's opt-in HTTP server for ``/metrics`` and ``/healthz``.

`MetricsServer` answers ``GET /metrics`` (``prometheus_client.generate_latest``), ``GET /healthz``
(200 with ``{"status": "ok", ...}`` or 503 with the reason from the health callable) and 404
otherwise, from a `http.server.ThreadingHTTPServer` on a daemon thread. It listens on loopback
unless told otherwise (``--metrics-addr``), gives each connection a whole-request deadline (a
client sending one byte every few seconds is cut off at it), and serves a bounded number of
connections at once (more are closed at once). The metrics themselves are
:mod:`elastic.agent.observe.metrics`'.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from elastic.agent.errors import MetricsServerError
from elastic.agent.observe.metrics import render

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_REQUEST_DEADLINE",
    "HealthCheck",
    "MetricsServer",
    "MetricsServerError",
]


# -- the HTTP server ---------------------------------------------------------------------------
HealthCheck = Callable[[], "tuple[bool, str]"]


DEFAULT_REQUEST_DEADLINE = 10.0
"""Seconds one connection has to send its request and read the answer."""

DEFAULT_MAX_CONNECTIONS = 16
"""Connections served at once; a scraper and a probe need two."""


class MetricsServer:
    """Serves ``/metrics`` and ``/healthz`` on ``host:port`` from a daemon thread.

    ``port=0`` picks a free port; read `port` after `start`. ``host`` is loopback by default
    (``0.0.0.0`` or ``::`` serve every interface). ``health`` returns ``(healthy, reason)``; an
    exception from it counts as unhealthy. Each connection must be done within
    ``request_deadline`` seconds; beyond ``max_connections`` at once, new ones are closed.

    Raises (from the constructor):
        ValueError: the port, deadline or connection cap is out of range.
    """

    def __init__(
        self,
        port: int,
        host: str = "127.0.0.1",
        *,
        registry: Collector,
        health: HealthCheck | None = None,
        request_deadline: float = DEFAULT_REQUEST_DEADLINE,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"The metrics port ({port}) must be between 0 and 65535.")
        if not request_deadline > 0:
            raise ValueError(f"The metrics request deadline ({request_deadline}) must be positive.")
        if not isinstance(max_connections, int) or max_connections < 1:
            raise ValueError(f"The metrics connection cap ({max_connections}) must be a positive integer.")
        self.host = host
        self.request_deadline = request_deadline
        self.max_connections = max_connections
        self._requested_port = port
        self.registry = registry
        self.health: HealthCheck = health if health is not None else (lambda: (True, "ok"))
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopped = False

    @property
    def port(self) -> int:
        """The port actually bound. Raises RuntimeError before `start`."""
        if self._server is None:
            raise RuntimeError("The metrics server has not been started.")
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        """``http://host:port`` to reach the server from this machine (loopback for a wildcard)."""
        host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def start(self) -> MetricsServer:
        """Bind and serve in the background; returns self.

        Raises:
            MetricsServerError: the port is in use or cannot be bound (names the flag
                ``--metrics-port``).
            RuntimeError: already started, or stopped.
        """
        with self._lock:
            if self._server is not None or self._stopped:
                raise RuntimeError("A metrics server can be started only once.")
            self._server = self._bind()
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.1},
                name=f"metrics-server:{self.port}",
                daemon=True,
            )
            self._thread.start()
        log.info("Serving /metrics and /healthz on %s:%s.", self.host, self.port)
        return self

    def stop(self) -> None:
        """Stop serving and free the port; idempotent, and safe before `start`."""
        with self._lock:
            server, thread = self._server, self._thread
            self._stopped = True
            self._thread = None
        if thread is None or server is None:
            return
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        log.info("Stopped the metrics server on %s:%s.", self.host, server.server_address[1])

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _bind(self) -> ThreadingHTTPServer:
        server_class = _IPv6Server if ":" in self.host else _Server
        try:
            server = server_class((self.host, self._requested_port), _Handler)
        except OSError as e:
            where = f"{self.host}:{self._requested_port}"
            if e.errno == errno.EADDRINUSE:
                raise MetricsServerError(
                    f"The metrics port {self._requested_port} is already in use on {self.host}; "
                    "choose another with --metrics-port (0 picks a free one)."
                ) from e
            raise MetricsServerError(
                f"Cannot serve metrics on {where}: {e.strerror or e}; "
                "check --metrics-addr and --metrics-port (0 picks a free one)."
            ) from e
        server.owner = self
        server.slots = threading.BoundedSemaphore(self.max_connections)
        return server

    def _health(self) -> tuple[bool, str]:
        try:
            healthy, reason = self.health()
        except Exception as e:  # a broken health check must not kill the server thread
            log.exception("The health check raised.")
            return False, f"the health check raised {type(e).__name__}: {e}"
        return bool(healthy), str(reason)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: MetricsServer
    slots: threading.BoundedSemaphore

    def process_request(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        """Serve on a thread while under the connection cap; otherwise close the connection at once."""
        if not self.slots.acquire(blocking=False):
            log.debug("metrics server: %s refused, %d connections already", client_address,
                         self.owner.max_connections)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


class _DeadlineReader(io.RawIOBase):
    """Reads a socket so that no read ends past ``deadline`` (a per-read timeout alone lets a
    client that sends a byte just inside it hold the connection forever)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def, override]
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request deadline passed")
        self._sock.settimeout(remaining)
        return self._sock.recv_into(buffer)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "etcd-elastic-agent"

    def setup(self) -> None:
        deadline = time.monotonic() + self.server.owner.request_deadline
        super().setup()
        self.connection.settimeout(self.server.owner.request_deadline)  # also bounds the writes
        self.rfile.close()  # reads go through the deadline instead
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, deadline))

    def do_GET(self) -> None:  # noqa: N802  (http.server's naming)
        path = urlsplit(self.path).path
        owner = self.server.owner
        if path == "/metrics":
            self._reply(HTTPStatus.OK, CONTENT_TYPE_LATEST, render(owner.registry))
        elif path == "/healthz":
            healthy, reason = owner._health()
            status = HTTPStatus.OK if healthy else HTTPStatus.SERVICE_UNAVAILABLE
            body = json.dumps({"status": "ok" if healthy else "unhealthy", "reason": reason})
            self._reply(status, "application/json", body + "\n")
        else:
            self._reply(HTTPStatus.NOT_FOUND, "text/plain; charset=utf-8",
                        "Not found; try /metrics or /healthz.\n")

    def _reply(self, status: HTTPStatus, content_type: str, body: str | bytes) -> None:
        data = body.encode("utf-8") if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug("metrics server: %s - " + format, self.address_string(), *args)
