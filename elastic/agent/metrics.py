"""Prometheus metrics for the agent, and the opt-in HTTP server for ``/metrics`` and ``/healthz``.

A tiny registry (counters, gauges, histograms, each with fixed label names) rendered in the
Prometheus text exposition format 0.0.4, so the agent needs no client library. `AgentMetrics`
defines every metric the agent updates, with one method per thing that happens, so metric and
label names cannot be misspelled at the call site::

    metrics = AgentMetrics(run_id="job1", node="host-a")
    server = MetricsServer(9400, registry=metrics.registry, health=agent_health).start()
    metrics.round_joined(duration_s=0.4, members=2)
    ...
    server.stop()

`MetricsServer` answers ``GET /metrics`` (the exposition text), ``GET /healthz`` (200 with
``{"status": "ok", ...}`` or 503 with the reason from the health callable) and 404 otherwise,
from a `http.server.ThreadingHTTPServer` on a daemon thread. It listens on loopback unless
told otherwise (``--metrics-addr``), gives each connection a whole-request deadline (a client
sending one byte every few seconds is cut off at it), and serves a bounded number of
connections at once (more are closed at once).
"""

from __future__ import annotations

import bisect
import errno
import io
import json
import logging
import math
import re
import signal as signal_module
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TypeVar
from urllib.parse import urlsplit

from elastic.agent.events import RestartCause

logger = logging.getLogger(__name__)

__all__ = [
    "AGENT_INFO",
    "AgentMetrics",
    "Counter",
    "Gauge",
    "Histogram",
    "MEMBERS",
    "MetricsServer",
    "MetricsServerError",
    "NODES_WAITING",
    "RESTARTS_TOTAL",
    "ROUND_DURATION_BUCKETS",
    "ROUND_DURATION_SECONDS",
    "ROUNDS_TOTAL",
    "Registry",
    "WORKER_EXITS_TOTAL",
    "WORKER_STATES",
    "WORKERS",
]

# -- metric names the agent exports ------------------------------------------------------------
AGENT_INFO = "elastic_agent_info"
ROUNDS_TOTAL = "elastic_rendezvous_rounds_total"
ROUND_DURATION_SECONDS = "elastic_rendezvous_round_duration_seconds"
MEMBERS = "elastic_members"
NODES_WAITING = "elastic_nodes_waiting"
SPARES = "elastic_spares"
EXCLUDED = "elastic_node_excluded"
RENDEZVOUS_JOINED_NODES = "elastic_rendezvous_joined_nodes"
RESTARTS_TOTAL = "elastic_restarts_total"
WORKERS = "elastic_workers"
WORKER_EXITS_TOTAL = "elastic_worker_exits_total"

WORKER_STATES = ("running", "succeeded", "failed")
# A round takes from tens of milliseconds (everyone present) to the last-call window or the
# join timeout (minutes) when nodes are slow to arrive.
ROUND_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                          600.0)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")

LabelValues = tuple[str, ...]
_M = TypeVar("_M", bound="_Metric")


# -- the registry ------------------------------------------------------------------------------
class _Metric:
    """A named family of samples, one per combination of label values. Thread-safe."""

    kind = ""

    def __init__(self, name: str, help: str, labels: Sequence[str] = ()) -> None:
        if not _METRIC_NAME.match(name):
            raise ValueError(f"The metric name {name!r} is not a valid Prometheus name.")
        for label in labels:
            if not _LABEL_NAME.match(label) or label.startswith("__"):
                raise ValueError(f"The label name {label!r} of {name} is not valid.")
        if len(set(labels)) != len(labels):
            raise ValueError(f"The label names of {name} repeat: {list(labels)}.")
        self.name = name
        self.help = help
        self.label_names: tuple[str, ...] = tuple(labels)
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, object]) -> LabelValues:
        if set(labels) != set(self.label_names):
            raise ValueError(
                f"{self.name} takes labels {sorted(self.label_names)}, got {sorted(labels)}."
            )
        return tuple(str(labels[n]) for n in self.label_names)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {_escape_help(self.help)}", f"# TYPE {self.name} {self.kind}"]
        lines.extend(self._samples())
        return lines

    def _samples(self) -> list[str]:
        raise NotImplementedError

    def _labels_text(self, key: LabelValues, extra: Iterable[tuple[str, str]] = ()) -> str:
        pairs = list(zip(self.label_names, key)) + list(extra)
        if not pairs:
            return ""
        return "{" + ",".join(f'{n}="{_escape_label(v)}"' for n, v in pairs) + "}"


class _ValueMetric(_Metric):
    def __init__(self, name: str, help: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, help, labels)
        # An unlabelled metric is always exported (as 0 until set); labelled ones once touched.
        self._values: dict[LabelValues, float] = {} if self.label_names else {(): 0.0}

    def value(self, **labels: object) -> float:
        """The current value for ``labels`` (0 if never set)."""
        key = self._key(labels)
        with self._lock:
            return self._values.get(key, 0.0)

    def _add(self, amount: float, labels: dict[str, object]) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def _samples(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{self._labels_text(k)} {_format_value(v)}" for k, v in items]


class Counter(_ValueMetric):
    """A count that only goes up."""

    kind = "counter"

    def inc(self, amount: float = 1.0, **labels: object) -> None:
        """Add ``amount``. Raises ValueError if it is negative or the labels do not match."""
        if amount < 0 or math.isnan(amount):
            raise ValueError(f"{self.name} can only increase; got {amount}.")
        self._add(amount, labels)


class Gauge(_ValueMetric):
    """A value that goes up and down."""

    kind = "gauge"

    def set(self, value: float, **labels: object) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def inc(self, amount: float = 1.0, **labels: object) -> None:
        self._add(amount, labels)

    def dec(self, amount: float = 1.0, **labels: object) -> None:
        self._add(-amount, labels)


class Histogram(_Metric):
    """Observations counted into cumulative ``le`` buckets, with their sum and count."""

    kind = "histogram"

    def __init__(
        self, name: str, help: str, buckets: Sequence[float], labels: Sequence[str] = ()
    ) -> None:
        super().__init__(name, help, labels)
        if "le" in self.label_names:
            raise ValueError(f"The histogram {name} cannot have a label named 'le'.")
        bounds = [float(b) for b in buckets if not math.isinf(b)]
        if not bounds or bounds != sorted(set(bounds)) or any(math.isnan(b) for b in bounds):
            raise ValueError(f"The buckets of {name} must be increasing numbers; got {buckets}.")
        self.buckets: tuple[float, ...] = (*bounds, math.inf)
        # Per label values: [count per bucket (not cumulative)..., sum]
        self._data: dict[LabelValues, list[float]] = {}
        if not self.label_names:
            self._data[()] = [0.0] * (len(self.buckets) + 1)

    def observe(self, value: float, **labels: object) -> None:
        key = self._key(labels)
        value = float(value)
        last = len(self.buckets) - 1
        index = last if math.isnan(value) else bisect.bisect_left(self.buckets, value)
        with self._lock:
            data = self._data.setdefault(key, [0.0] * (len(self.buckets) + 1))
            data[index] += 1
            data[-1] += value

    def count(self, **labels: object) -> int:
        """How many values were observed for ``labels``."""
        key = self._key(labels)
        with self._lock:
            return int(sum(self._data.get(key, [0.0])[:-1]))

    def _samples(self) -> list[str]:
        with self._lock:
            items = sorted((k, list(v)) for k, v in self._data.items())
        lines = []
        for key, data in items:
            cumulative = 0.0
            for bound, count in zip(self.buckets, data[:-1]):
                cumulative += count
                labels = self._labels_text(key, [("le", _format_value(bound))])
                lines.append(f"{self.name}_bucket{labels} {_format_value(cumulative)}")
            lines.append(f"{self.name}_sum{self._labels_text(key)} {_format_value(data[-1])}")
            lines.append(f"{self.name}_count{self._labels_text(key)} {_format_value(cumulative)}")
        return lines


class Registry:
    """Holds metric families by name and renders them all. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._metrics: dict[str, _Metric] = {}

    def counter(self, name: str, help: str, labels: Sequence[str] = ()) -> Counter:
        return self._add(Counter(name, help, labels))

    def gauge(self, name: str, help: str, labels: Sequence[str] = ()) -> Gauge:
        return self._add(Gauge(name, help, labels))

    def histogram(
        self, name: str, help: str, buckets: Sequence[float], labels: Sequence[str] = ()
    ) -> Histogram:
        return self._add(Histogram(name, help, buckets, labels))

    def get(self, name: str) -> _Metric:
        """The metric called ``name``. Raises KeyError if there is none."""
        with self._lock:
            return self._metrics[name]

    def render(self) -> str:
        """All metrics in the text exposition format 0.0.4, ending with a newline."""
        with self._lock:
            metrics = list(self._metrics.values())
        lines = [line for metric in metrics for line in metric.render()]
        return "\n".join(lines) + "\n" if lines else ""

    def _add(self, metric: _M) -> _M:
        with self._lock:
            if metric.name in self._metrics:
                raise ValueError(f"A metric named {metric.name} is already registered.")
            self._metrics[metric.name] = metric
        return metric



def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


# -- the agent's metrics -----------------------------------------------------------------------
class AgentMetrics:
    """Every metric the agent exports, updated through one method per event."""

    def __init__(self, *, run_id: str, node: str, registry: Registry | None = None) -> None:
        self.registry = registry if registry is not None else Registry()
        r = self.registry
        self.info = r.gauge(AGENT_INFO, "Always 1; labels name the run and this node.",
                            ("run_id", "node"))
        self.rounds = r.counter(ROUNDS_TOTAL, "Rendezvous rounds this node has joined.")
        self.round_duration = r.histogram(
            ROUND_DURATION_SECONDS,
            "Seconds from starting a rendezvous to being part of a closed round.",
            ROUND_DURATION_BUCKETS,
        )
        self.members = r.gauge(MEMBERS, "Nodes in the current round (0 before the first).")
        self.nodes_waiting = r.gauge(NODES_WAITING, "Nodes waiting to join the next round.")
        self.spares = r.gauge(SPARES, "Nodes waiting as spares beyond a full round (no restart for them).")
        self.excluded = r.gauge(EXCLUDED, "1 while this node is excluded after failures in a row (max_node_failures).")
        self.rendezvous_joined = r.gauge(
            RENDEZVOUS_JOINED_NODES,
            "While this node waits in a rendezvous: nodes joined to the round so far (0 when not waiting).",
        )
        self.restarts = r.counter(
            RESTARTS_TOTAL, "Restarts of the worker group, by cause.", ("cause",)
        )
        self.workers = r.gauge(WORKERS, "Local worker processes by state.", ("state",))
        self.worker_exits = r.counter(
            WORKER_EXITS_TOTAL,
            "Local worker exits: exitcode set for a normal exit, signal (name) when killed.",
            ("exitcode", "signal"),
        )
        self.info.set(1, run_id=run_id, node=node)
        for cause in RestartCause:
            self.restarts.inc(0, cause=cause.value)
        self.set_workers(running=0, succeeded=0, failed=0)

    def round_joined(self, *, duration_s: float, members: int) -> None:
        """This node is part of a newly closed round of ``members`` nodes."""
        self.rounds.inc()
        self.round_duration.observe(duration_s)
        self.members.set(members)

    def set_nodes_waiting(self, count: int, spares: int = 0) -> None:
        self.nodes_waiting.set(count)
        self.spares.set(spares)

    def set_rendezvous_joined(self, joined: int | None) -> None:
        """Nodes joined so far to the round this node waits for; None: not waiting (0)."""
        self.rendezvous_joined.set(joined or 0)

    def restart(self, cause: RestartCause | str) -> None:
        """The worker group is being restarted. Raises ValueError for an unknown cause."""
        self.restarts.inc(cause=RestartCause(cause).value)

    def set_workers(self, *, running: int, succeeded: int, failed: int) -> None:
        for state, count in zip(WORKER_STATES, (running, succeeded, failed)):
            self.workers.set(count, state=state)

    def worker_exit(self, *, exitcode: int | None, signal: int | str | None = None) -> None:
        """A local worker exited with ``exitcode``, or was killed by ``signal`` (a number or a
        name). A negative exitcode (as `subprocess` reports a signal) counts as that signal."""
        if signal is None and exitcode is not None and exitcode < 0:
            signal, exitcode = -exitcode, None
        self.worker_exits.inc(
            exitcode="" if exitcode is None else str(exitcode), signal=_signal_name(signal)
        )


def _signal_name(sig: int | str | None) -> str:
    if sig is None:
        return ""
    if isinstance(sig, str) and not sig.lstrip("-").isdigit():
        return sig
    try:
        return signal_module.Signals(abs(int(sig))).name
    except ValueError:
        return str(abs(int(sig)))


# -- the HTTP server ---------------------------------------------------------------------------
HealthCheck = Callable[[], "tuple[bool, str]"]


class MetricsServerError(RuntimeError):
    """The metrics server could not start; the message names the address and the cause."""


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
        registry: Registry,
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
        logger.info("Serving /metrics and /healthz on %s:%s.", self.host, self.port)
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
        logger.info("Stopped the metrics server on %s:%s.", self.host, server.server_address[1])

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
            logger.exception("The health check raised.")
            return False, f"the health check raised {type(e).__name__}: {e}"
        return bool(healthy), str(reason)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: MetricsServer
    slots: threading.BoundedSemaphore

    def process_request(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        """Serve on a thread while under the connection cap; otherwise close the connection at once."""
        if not self.slots.acquire(blocking=False):
            logger.debug("metrics server: %s refused, %d connections already", client_address,
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
            self._reply(HTTPStatus.OK, CONTENT_TYPE, owner.registry.render())
        elif path == "/healthz":
            healthy, reason = owner._health()
            status = HTTPStatus.OK if healthy else HTTPStatus.SERVICE_UNAVAILABLE
            body = json.dumps({"status": "ok" if healthy else "unhealthy", "reason": reason})
            self._reply(status, "application/json", body + "\n")
        else:
            self._reply(HTTPStatus.NOT_FOUND, "text/plain; charset=utf-8",
                        "Not found; try /metrics or /healthz.\n")

    def _reply(self, status: HTTPStatus, content_type: str, body: str) -> None:
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        logger.debug("metrics server: %s - " + format, self.address_string(), *args)
