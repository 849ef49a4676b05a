"""``run(config)``: the effectful half of ``elasticrun`` (parsing is the pure half, in elastic.launch.cli).

Sets up what the agent needs — the embedded store for ``--standalone``, the rendezvous handler,
the event log, the metrics server, signal handling (a signal only wakes the agent, see
:mod:`elastic.agent.waking`) — runs the agent, and returns the exit code.
Setup errors (a malformed endpoint, an unreachable backend, a busy metrics or master port) are
printed as one line, never as a traceback; torchrun's ``OMP_NUM_THREADS`` banner is printed only
after a set-up that succeeded.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import signal
import socket
import sys
import time
import uuid
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, Callable, Mapping

from backends.endpoints import Endpoint
from elastic import console
from elastic.agent.agent import ElasticAgent
from elastic.agent.attempts import NodeHelpers
from elastic.agent.exclusion import ExclusionPolicy
from elastic.agent.observe.events import Event, EventLog
from elastic.agent.observe.report import AgentReport
from elastic.agent.lifeline.keeper import Lifeline, state_dir
from elastic.agent.errors import AgentError
from elastic.agent.observe.summary import RunTally, summary_lines
from elastic.agent.observe.standing import Standing, health
from elastic.agent.processes.logs_specs import LogsSpecsHost, logs_specs_host
from elastic.agent.processes.log_dir import create_log_dir
from elastic.agent.processes.store_host import StoreHost
from elastic.agent.prewarm.pool import TemplatePool
from elastic.agent.waking import Waker
from elastic.agent.worker_env import omp_threads_notice, python_executable
from elastic.config import LaunchConfig
from elastic.rendezvous.api import Rendezvous
from elastic.rendezvous.errors import RendezvousError
from elastic.rendezvous.backend_spec import StandaloneSpec
from elastic.rendezvous.registry import create_handler
from elastic.rendezvous.secret_sources import hide_inline_secrets

if TYPE_CHECKING:
    from elastic.agent.lifeline.watchdog_process import Watchdog
    from elastic.agent.observe.metrics import AgentMetrics

log = logging.getLogger(__name__)


def run(config: LaunchConfig, *, watchdog: Watchdog | None = None) -> int:
    """Run the agent for ``config`` on this node; returns the process exit code.

    ``watchdog``: the lifeline watchdog if the caller started it already (it is then this
    run's to arm and to close); otherwise the run starts one.
    """
    started = time.monotonic()
    setup = console.console_setup(os.environ, config.verbose)
    console.configure(setup)
    hide_inline_secrets(os.environ)  # read into config.backend: no helper or worker inherits it
    notice = omp_threads_notice(os.environ, config.nproc_per_node)  # said when a round is first joined
    with ExitStack() as cleanup:
        if watchdog is not None:
            cleanup.callback(watchdog.close)  # unless the lifeline took it over (then a no-op)
        try:
            logs_specs = _start_logs_specs(config, cleanup)  # imports torch while the rest is set up
            if config.log_dir:
                create_log_dir(config.log_dir)  # what the CLI could not tell before creating it
            # torchrun's --standalone gives workers MASTER_ADDR=localhost; match it.
            node_addr = config.local_addr or ("localhost" if config.standalone else socket.getfqdn())
            config = _with_standalone_store(config, cleanup)
            settings = config.rendezvous
            with console.quiet_grpc(setup):  # the etcd client starts gRPC here, if at all
                handler = create_handler(config.backend, settings, node_addr, local_world_size=config.nproc_per_node,
                                         role=config.role)
            # The node id, not the host name: two agents on one host are two nodes.
            events = cleanup.enter_context(EventLog(config.event_log, run_id=config.run_id, node=handler.node_id,
                                                    host=socket.gethostname()))
            tally = RunTally()
            events.listen(tally)
            if notice:  # about the workers: not before a set-up or rendezvous error, then the only line
                events.listen(_say_once_joined(notice))
            metrics = _new_metrics(config, handler)
            store_host = StoreHost(python_executable(os.environ), os.environ)
            cleanup.callback(store_host.close)  # started when first needed (elastic.agent.attempts)
            templates = _start_templates(config, cleanup)
            lifeline = _open_lifeline(config, cleanup, watchdog)
            exclusion = (ExclusionPolicy(settings.max_node_failures, settings.exclusion_cooldown, settings.min_nodes)
                         if settings.max_node_failures else None)
            waker = Waker()
            cleanup.callback(waker.close)
            # Forked or kept workers need no import at a restart that moves the master here: nor should its store.
            helpers = NodeHelpers(store_host, lifeline, templates, logs_specs,
                                  warm_store_host=templates is not None or config.live_recovery)
            report = AgentReport(events, metrics, None, run_id=handler.run_id, host=socket.gethostname())
            agent = ElasticAgent(config, handler, report, helpers=helpers, exclusion=exclusion, waker=waker)
            if metrics is not None:
                _serve_metrics(config, metrics, _looker(agent, handler), cleanup)
            if logs_specs is not None:
                logs_specs.wait_ready()  # a plugin that cannot load stops us before we join, as in torchrun
        except (RendezvousError, AgentError, ValueError) as error:
            print(f"elasticrun: {error}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:  # e.g. while it waits for a store that is not up yet
            print("elasticrun: interrupted before the workers started", file=sys.stderr)
            return 128 + signal.SIGINT
        with waker.catching(config.signals_to_handle):
            result = agent.run()
    if result.exit_code != 0:
        print(f"elasticrun: {result.reason}", file=sys.stderr)
    for line in summary_lines(tally.facts(), run_id=config.run_id, node=handler.node_id,
                              wall_s=time.monotonic() - started, exit_code=result.exit_code):
        log.info("%s", line, extra=console.CONSOLE)
    return result.exit_code


def _with_standalone_store(config: LaunchConfig, cleanup: ExitStack) -> LaunchConfig:
    """For ``--standalone``: host the built-in store on a free loopback port, with a random token;
    the config then names that store (a ``tcp`` :class:`StoreSpec`) and a run id."""
    if not isinstance(config.backend, StandaloneSpec):
        return config
    from backends.tcp.server import start_server

    token = secrets.token_hex(16)
    server = start_server("127.0.0.1", 0, token)
    cleanup.callback(server.stop)
    run_id = config.run_id if config.run_id not in ("", "none") else str(uuid.uuid4())
    return dataclasses.replace(config, run_id=run_id, rendezvous=dataclasses.replace(config.rendezvous, run_id=run_id),
                               backend=config.backend.hosted_at(Endpoint(server.host, server.port), token))


def _start_logs_specs(config: LaunchConfig, cleanup: ExitStack) -> LogsSpecsHost | None:
    """For ``--logs-specs``: start the plugin's helper, which every attempt's workers then use."""
    if not config.logs_specs:
        return None
    host = logs_specs_host(config, os.environ, python_executable(os.environ))
    cleanup.callback(host.close)
    host.start()
    return host


def _start_templates(config: LaunchConfig, cleanup: ExitStack) -> TemplatePool | None:
    """For ``--prewarm``: the worker templates, importing while the rendezvous runs."""
    if not config.prewarm or not TemplatePool.serves(config.entrypoint):
        return None
    pool = TemplatePool(config, os.environ, python_executable(os.environ))
    cleanup.callback(pool.close)
    pool.start()  # from the main thread: the templates' parent-death signal follows it
    return pool


def _open_lifeline(config: LaunchConfig, cleanup: ExitStack, watchdog: Watchdog | None) -> Lifeline | None:
    """Stop what a dead agent of this run left, arm the watchdog (``watchdog``, or a new one);
    on failure, one warning line (the parent-death signal still covers the workers on Linux)."""
    try:
        lifeline = Lifeline.open(state_dir(config.log_dir, config.run_id), config.run_id, socket.gethostname(),
                                 watchdog=watchdog if watchdog is not None else True)
    except OSError as error:
        print(f"elasticrun: warning: no PID file or watchdog for the workers ({error}); if this agent is "
              "killed, only the workers themselves (Linux) are sure to die with it", file=sys.stderr)
        return None
    cleanup.callback(lifeline.close)
    return lifeline


def _new_metrics(config: LaunchConfig, handler: Rendezvous) -> AgentMetrics | None:
    """The agent's metrics with ``--metrics-port`` (None without: prometheus_client and the HTTP
    server are then not even imported, a few tens of milliseconds of every start)."""
    if config.metrics_port is None:
        return None
    from elastic.agent.observe.metrics import AgentMetrics

    # The node id, not the host name: two agents on one host are two nodes.
    metrics = AgentMetrics(run_id=config.run_id, node=handler.node_id)
    metrics.watch_store_outage(lambda: handler.membership().store_outage)
    metrics.watch_store_full(lambda: handler.membership().store_full)
    return metrics


def _serve_metrics(config: LaunchConfig, metrics: AgentMetrics, look: Callable[[], Standing],
                   cleanup: ExitStack) -> None:
    """Serve /metrics and /healthz; the membership gauges say what /healthz says, at every moment.

    Raises:
        MetricsServerError: the port cannot be bound.
    """
    from elastic.agent.observe.metrics_server import MetricsServer

    metrics.follow(look)
    server = MetricsServer(config.metrics_port, config.metrics_addr, registry=metrics.registry,
                           health=lambda: health(look()))
    cleanup.callback(server.stop)
    server.start()  # it logs where it serves


def _looker(agent: ElasticAgent, handler: Rendezvous) -> Callable[[], Standing]:
    """One look at where this node stands, without I/O: what /healthz and the gauges say."""
    def look() -> Standing:
        joined = agent.round
        return Standing(agent.healthy, handler.progress(), joined.group_world_size if joined else 0,
                        handler.membership())
    return look


def _say_once_joined(notice: str) -> Callable[[Mapping[str, Any]], None]:
    """An event listener that says ``notice`` on the console at the first round joined: just
    before the workers start, so a mistake the set-up or the rendezvous catches stays the only line."""
    said = False

    def listener(record: Mapping[str, Any]) -> None:
        nonlocal said
        if not said and record.get("event") == Event.ROUND_JOINED.value:
            said = True
            log.info("%s", notice, extra=console.CONSOLE)

    return listener
