"""Prometheus metrics for the agent: the metric names, `AgentMetrics`, and `render`.

The metrics are ``prometheus_client`` collectors in a registry of their own per agent (never the
library's global one: several agents may share a process, as in the tests). `AgentMetrics`
defines every metric the agent updates, with one method per thing that happens, so metric and
label names cannot be misspelled at the call site::

    metrics = AgentMetrics(run_id="job1", node="host-a")
    server = MetricsServer(9400, registry=metrics.registry, health=agent_health).start()
    metrics.round_joined(duration_s=0.4, members=2)
    ...
    server.stop()

The opt-in HTTP server for ``/metrics`` and ``/healthz`` is
:class:`elastic.agent.observe.metrics_server.MetricsServer`.
"""

from __future__ import annotations

import signal as signal_module
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from elastic.agent.observe.events import RestartCause
from elastic.agent.observe.standing import Standing, gauges

__all__ = [
    "AGENT_INFO",
    "AgentMetrics",
    "EXCLUDED",
    "IDENTITY_LABELS",
    "MEMBERS",
    "NODES_WAITING",
    "RENDEZVOUS_JOINED_NODES",
    "RESTARTS_TOTAL",
    "ROUND_DURATION_BUCKETS",
    "ROUND_DURATION_SECONDS",
    "ROUNDS_TOTAL",
    "SPARES",
    "STORE_NOSPACE",
    "STORE_OUTAGE_SECONDS",
    "WORKER_EXITS_TOTAL",
    "WORKER_STATES",
    "WORKERS",
    "render",
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
STORE_OUTAGE_SECONDS = "elastic_store_outage_seconds"
STORE_NOSPACE = "elastic_store_nospace"

WORKER_STATES = ("running", "succeeded", "failed")
# A round takes from tens of milliseconds (everyone present) to the last-call window or the
# join timeout (minutes) when nodes are slow to arrive.
ROUND_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                          600.0)


# -- the agent's metrics -----------------------------------------------------------------------
IDENTITY_LABELS = ("run_id", "node")
"""The labels every agent metric carries: the run and the node id (``--rdzv-id`` and the rendezvous
node id). Each agent exports only its own values, so they add no series to a scrape; a restarted
agent's new node id starts new series, as a restarted pod's name does under Kubernetes."""


class AgentMetrics:
    """Every metric the agent exports, updated through one method per event.

    Every series carries ``run_id`` and ``node`` (`IDENTITY_LABELS`), so a dashboard filters and
    groups by them without a join.

    Args:
        run_id, node: the run and this node's id.
        registry: where the metrics are registered (default: a new one for this agent).

    Raises:
        ValueError: ``registry`` already holds one of these metrics.
    """

    def __init__(self, *, run_id: str, node: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        ids = {"run_id": run_id, "node": node}

        def counter(name: str, text: str, *labels: str) -> Counter:
            return Counter(name, text, IDENTITY_LABELS + labels, registry=r)

        def gauge(name: str, text: str, *labels: str) -> Gauge:
            return Gauge(name, text, IDENTITY_LABELS + labels, registry=r)

        self.info = gauge(AGENT_INFO, "Always 1; labels name the run and this node.").labels(**ids)
        self.rounds = counter(ROUNDS_TOTAL, "Rendezvous rounds this node has joined.").labels(**ids)
        self.round_duration = Histogram(
            ROUND_DURATION_SECONDS,
            "Seconds from starting a rendezvous to being part of a closed round.",
            IDENTITY_LABELS, buckets=ROUND_DURATION_BUCKETS, registry=r,
        ).labels(**ids)
        self.members = gauge(MEMBERS, "Nodes in the round this node runs in (0 before the first and while it "
                             "waits in a rendezvous).").labels(**ids)
        self.nodes_waiting = gauge(NODES_WAITING, "Nodes waiting to join the next round.").labels(**ids)
        self.spares = gauge(SPARES, "Nodes waiting as spares beyond a full round (no restart for them).").labels(**ids)
        self.excluded = gauge(EXCLUDED, "1 while this node is excluded after failures in a row "
                              "(max_node_failures).").labels(**ids)
        self.rendezvous_joined = gauge(
            RENDEZVOUS_JOINED_NODES,
            "While this node waits in a rendezvous: nodes joined to the round so far (0 when not waiting).",
        ).labels(**ids)
        self._restarts = counter(RESTARTS_TOTAL, "Restarts of the worker group, by cause.", "cause")
        self._workers = gauge(WORKERS, "Local worker processes by state.", "state")
        self._worker_exits = counter(
            WORKER_EXITS_TOTAL,
            "Local worker exits: exitcode set for a normal exit, signal (name) when killed.",
            "exitcode", "signal",
        )
        self.store_outage = gauge(
            STORE_OUTAGE_SECONDS,
            "Seconds the store has not answered this node's keepalives (0 while it answers); the workers "
            "train on until store_outage_timeout.",
        ).labels(**ids)
        self.store_nospace = gauge(
            STORE_NOSPACE,
            "1 while the store refuses this node's writes for lack of space (etcd's NOSPACE alarm): a rendezvous "
            "waits until an operator compacts, defragments and disarms it; else 0.",
        ).labels(**ids)
        self._ids = ids
        self.info.set(1)
        for cause in RestartCause:
            self._restarts.labels(cause=cause.value, **ids)  # exported as 0 from the start
        self.set_workers(running=0, succeeded=0, failed=0)

    def round_joined(self, *, duration_s: float, members: int) -> None:
        """This node is part of a newly closed round of ``members`` nodes."""
        self.rounds.inc()
        self.round_duration.observe(duration_s)
        self.members.set(members)

    def follow(self, look: Callable[[], Standing]) -> None:
        """Read the membership gauges (members, waiting nodes, spares, joined while waiting) from
        ``look()`` at each scrape: the look ``/healthz`` answers from, so they always agree
        (:mod:`elastic.agent.observe.standing`). Their setters have no effect from then on."""
        self.members.set_function(lambda: gauges(look()).members)
        self.nodes_waiting.set_function(lambda: gauges(look()).nodes_waiting)
        self.spares.set_function(lambda: gauges(look()).spares)
        self.rendezvous_joined.set_function(lambda: gauges(look()).joined)

    def watch_store_outage(self, seconds: Callable[[], float]) -> None:
        """Read ``elastic_store_outage_seconds`` from ``seconds()`` at each scrape (no polling thread)."""
        self.store_outage.set_function(seconds)

    def watch_store_full(self, full: Callable[[], bool]) -> None:
        """Read ``elastic_store_nospace`` from ``full()`` at each scrape (no polling thread)."""
        self.store_nospace.set_function(lambda: 1.0 if full() else 0.0)

    def set_nodes_waiting(self, count: int, spares: int = 0) -> None:
        self.nodes_waiting.set(count)
        self.spares.set(spares)

    def set_rendezvous_joined(self, joined: int | None) -> None:
        """Nodes joined so far to the round this node waits for; None: not waiting (0)."""
        self.rendezvous_joined.set(joined or 0)

    def set_excluded(self, excluded: bool) -> None:
        """This node is (or no longer is) excluded after failures in a row."""
        self.excluded.set(1 if excluded else 0)

    def restart(self, cause: RestartCause | str) -> None:
        """The worker group is being restarted. Raises ValueError for an unknown cause."""
        self._restarts.labels(cause=RestartCause(cause).value, **self._ids).inc()

    def set_workers(self, *, running: int, succeeded: int, failed: int) -> None:
        for state, count in zip(WORKER_STATES, (running, succeeded, failed)):
            self._workers.labels(state=state, **self._ids).set(count)

    def worker_exit(self, *, exitcode: int | None, signal: int | str | None = None) -> None:
        """A local worker exited with ``exitcode``, or was killed by ``signal`` (a number or a
        name). A negative exitcode (as `subprocess` reports a signal) counts as that signal."""
        if signal is None and exitcode is not None and exitcode < 0:
            signal, exitcode = -exitcode, None
        self._worker_exits.labels(
            exitcode="" if exitcode is None else str(exitcode), signal=_signal_name(signal), **self._ids
        ).inc()


def _signal_name(sig: int | str | None) -> str:
    if sig is None:
        return ""
    if isinstance(sig, str) and not sig.lstrip("-").isdigit():
        return sig
    try:
        return signal_module.Signals(abs(int(sig))).name
    except ValueError:
        return str(abs(int(sig)))


class _WithoutCreated(Collector):
    """``registry``'s metrics minus the ``*_created`` timestamps the client adds to counters and
    histograms: the agent exports the series its documentation lists, and no others."""

    def __init__(self, registry: Collector) -> None:
        self._registry = registry

    def collect(self) -> Iterable[Metric]:
        for metric in self._registry.collect():
            metric.samples = [s for s in metric.samples if s.name != metric.name + "_created"]
            yield metric


def render(registry: Collector) -> bytes:
    """``registry`` in the Prometheus text format (``CONTENT_TYPE_LATEST``)."""
    return generate_latest(_WithoutCreated(registry))
