"""Each attempt's worker group on this node: started with its store and lifeline, stopped once.

The agent (:mod:`elastic.agent.agent`) decides when; this module does the starting and the
stopping: the pre-warmed templates waited for where a signal is seen, the master's store handed
to the store helper, the workers' pids tracked by the lifeline, and all of it undone at the stop.
It also numbers the attempts (each start, and each replacement of failed workers, is one), and
takes the agent's one look per turn at the running group (:meth:`Attempts.look`), replacing its
failed workers first when :func:`~elastic.agent.live.decisions.refills` says so. It never asks
which kind of group it holds: a group still running at a start was kept for the new round.

The store helper (:mod:`elastic.agent.processes.store_host`) is started when this node first
hosts a store, just after its workers are spawned: its torch import then overlaps the workers'
own instead of slowing their start (the workers' connections wait on the listening socket
meanwhile). A node that never hosts never starts one, unless the launcher asks to warm it
(:attr:`NodeHelpers.warm_store_host`: workers forked from templates, ``--prewarm``, or kept live,
``--live-recovery``): there a restart that moves the master here forks its workers at once, or
needs no new worker at all, so the helper is warmed after the first start, to be ready by then.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from dataclasses import dataclass

from elastic.agent.errors import StoreHostError, WorkerStartError
from elastic.agent.groups import GroupFactory, Workers
from elastic.agent.lifeline.keeper import Lifeline
from elastic.agent.live.decisions import refills
from elastic.agent.observe.report import AgentReport
from elastic.agent.prewarm.pool import READY_TIMEOUT_S, TemplatePool
from elastic.agent.processes.group_state import WorkersView
from elastic.agent.processes.logs_specs import LogsSpecsHost
from elastic.agent.processes.store_host import StoreHost
from elastic.agent.waking import Waker
from elastic.rendezvous.api import RendezvousInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeHelpers:
    """The helpers the launcher runs beside this node's workers (each None: not used); the
    launcher starts and closes them.

    Attributes:
        store_host: hosts the master's store for the workers (None: rank 0's worker does).
        lifeline: tracks the workers' pids (None: no PID file).
        templates: pre-warmed worker templates (``--prewarm``; None: workers start normally).
        logs_specs: the helper of the ``--logs-specs`` plugin (None: none named).
        warm_store_host: start the store helper after the first workers even where no store is
            hosted yet, so a restart that moves the master here does not wait for its import.
    """

    store_host: StoreHost | None = None
    lifeline: Lifeline | None = None
    templates: TemplatePool | None = None
    logs_specs: LogsSpecsHost | None = None
    warm_store_host: bool = False


class Attempts:
    """Starts and stops the worker group of each attempt (one at a time), and looks at it.

    Args:
        groups: makes the group of an attempt.
        waker: the agent's waker (worker exits wake it; template waits happen on it).
        report: where a start failure is printed.
        helpers: the store helper, the lifeline and the templates.
        run_id, host: name the run and this node in logs.
        shutdown_timeout: seconds between SIGTERM and SIGKILL when stopping.
    """

    def __init__(self, groups: GroupFactory, waker: Waker, report: AgentReport, helpers: NodeHelpers, *,
                 run_id: str, host: str, shutdown_timeout: float) -> None:
        self._groups = groups
        self._waker = waker
        self._report = report
        self._helpers = helpers
        self._run_id = run_id
        self._host = host
        self._shutdown_timeout = shutdown_timeout
        self._store_host = helpers.store_host
        self._store_host_failed = False
        self._lifeline = helpers.lifeline
        self._templates = helpers.templates
        self._attempt = -1  # the number of the last attempt started (a log directory each)
        self.running: Workers | None = None
        """The group started and not yet stopped."""
        self.last: Workers | None = None
        """The group started last (kept after its stop, for its failure report)."""

    def await_templates(self, timeout: float, why: str) -> None:
        """Wait up to ``timeout`` seconds for the pre-warmed templates (if any) to import.

        Raises:
            Interrupted: a signal arrived meanwhile.
        """
        templates = self._templates
        if templates is None:
            return
        started = time.monotonic()
        ready = self._waker.call(lambda: templates.wait_ready(timeout), what="templates")
        log.info("Run %s node %s: %s after its worker templates %s (%.1fs)", self._run_id, self._host, why,
                 "are ready" if ready else "are not all ready (those ranks start normally)", time.monotonic() - started)

    def start(self, info: RendezvousInfo, restart_count: int) -> Workers | None:
        """Start the workers of the next attempt in round ``info``; None (after one console line)
        when they cannot start. A group still running was kept for this round (the agent did not
        stop it): it moves to the round instead (:meth:`Workers.move_to`). Call from the main
        thread: the workers' parent-death signal follows the thread that forked them
        (:mod:`elastic.agent.pdeathsig`).

        Raises:
            Interrupted: a signal arrived while waiting for the templates.
        """
        self._attempt += 1
        if self.running is not None:
            return self._move(self.running, info, restart_count)
        templates = self._templates
        if templates is not None:  # a fork waits for its template: wait here, where a signal is seen
            self._waker.call(lambda: templates.wait_ready(READY_TIMEOUT_S), what="templates")
        use_agent_store = self._use_agent_store(info)
        listener = info.master_listener
        if listener is not None and not use_agent_store:
            listener.close()  # rank 0's worker binds the port itself
        group = self._groups(info, attempt=self._attempt, restart_count=restart_count, use_agent_store=use_agent_store)
        group.on_exit(self._waker.wake)
        try:
            group.start()
        except WorkerStartError as error:
            if listener is not None:
                listener.close()
            self._report.print(f"elasticrun: cannot start the workers: {error}")
            return None
        if listener is not None and use_agent_store:
            self._hand_over(listener, info)
        if self._helpers.warm_store_host and self._store_host is not None:
            self._store_host.warm()  # ready when a restart moves the master here (see the module docstring)
        if self._lifeline is not None:
            self._lifeline.track(group.pids().values())
        self.running = self.last = group
        self._report.workers_started(info.round, sorted(group.pids()), [])
        self._report.started(info, group.global_ranks(), group.world_size)
        return group

    def look(self, restart_count: int, restart_left: bool) -> WorkersView:
        """The agent's one look at the running group this turn; its failed workers replaced first,
        in the round in use, when :func:`refills` says so (then the look after the replacement,
        keeping what the first said once). ``restart_count``: the replacements'
        ``TORCHELASTIC_RESTART_COUNT``."""
        group = self.running
        assert group is not None  # the agent looks only at a group it started
        view = group.look()
        if refills(view, restart_left, self._templates is not None) and self._refill(group, restart_count):
            after = group.look()
            view = after if after.formed is not None else dataclasses.replace(after, formed=view.formed)
        return view

    def stop(self, forward: int | None = None) -> None:
        """Stop the running group, if any (first sending it ``forward``, a signal number)."""
        group, self.running = self.running, None
        if group is None:
            return
        if forward is not None:
            group.send_signal(forward)
        group.stop(self._shutdown_timeout)
        if self._store_host is not None:
            self._store_host.release()
        if self._lifeline is not None:
            self._lifeline.untrack(group.pids().values())

    def _refill(self, group: Workers, restart_count: int) -> bool:
        """Replace the failed workers in the round in use (:meth:`Workers.refill`), as attempt
        number one past the last; whether any was started. A replacement that cannot start is
        left to the restart that follows (one console line)."""
        before = set(group.pids().values())
        try:
            ranks = group.refill(attempt=self._attempt + 1, restart_count=restart_count,
                                 use_agent_store=self._use_agent_store(group.rdzv))
        except WorkerStartError as error:
            self._report.print(f"elasticrun: cannot replace the failed workers in round {group.rdzv.round}: {error}")
            return False
        self._retrack(group, before)
        if not ranks:
            return False
        self._attempt += 1  # the replacements' log directory; the next round's workers get the one after
        self._report.workers_started(group.rdzv.round, list(ranks),
                                     [rank for rank in sorted(group.pids()) if rank not in ranks], refill=True)
        return True

    def _move(self, group: Workers, info: RendezvousInfo, restart_count: int) -> Workers | None:
        """Move the kept workers to round ``info`` (its store handed to the helper after, as at a start)."""
        before = set(group.pids().values())
        use_agent_store = self._use_agent_store(info)
        listener = info.master_listener
        if listener is not None and not use_agent_store:
            listener.close()
        try:
            restarted = group.move_to(info, attempt=self._attempt, restart_count=restart_count,
                                      use_agent_store=use_agent_store)
        except WorkerStartError as error:
            if listener is not None:
                listener.close()
            self._report.print(f"elasticrun: cannot restart the workers: {error}")
            self.stop()
            return None
        if listener is not None and use_agent_store:
            self._hand_over(listener, info)
        self._retrack(group, before)
        self._report.workers_started(info.round, list(restarted),
                                     [rank for rank in sorted(group.pids()) if rank not in restarted])
        return group

    def _retrack(self, group: Workers, before: set[int]) -> None:
        """Tell the lifeline which workers replaced which (``before``: the pids until now)."""
        if self._lifeline is not None:
            after = set(group.pids().values())
            self._lifeline.untrack(before - after)
            self._lifeline.track(after - before)

    def close(self) -> None:
        """Stop the store helper (the agent is done)."""
        if self._store_host is not None:
            self._store_host.close()

    def _use_agent_store(self, info: RendezvousInfo) -> bool:
        """Whether workers use an agent-hosted store (``TORCHELASTIC_USE_AGENT_STORE``).

        On the master node the store helper serves the master port the round names, on the
        socket that has listened since the join (the static rendezvous: since set-up); workers
        everywhere connect as clients. Without a helper (one that failed before) rank 0's worker
        hosts it.
        """
        if info.master_listener is None:  # another node hosts (or nobody can: then rank 0's worker does)
            return info.group_rank != 0 and self._store_host is not None
        return self._store_host is not None and not self._store_host_failed

    def _hand_over(self, listener: socket.socket, info: RendezvousInfo) -> None:
        """Give the master port's socket to the store helper (started now if it is not running).

        A helper that cannot start or take it (it runs the workers' interpreter, which just
        started them, so this is rare) leaves this attempt's workers without a store: they fail
        and restart, and from then on rank 0's worker hosts it.
        """
        assert self._store_host is not None  # _use_agent_store said so
        try:
            self._store_host.serve(listener, info.master_addr)
        except StoreHostError as error:
            self._store_host_failed = True
            log.warning("Run %s node %s: %s; this attempt's workers cannot reach their store and will restart, "
                        "with rank 0's worker hosting it", info.run_id, self._host, error)
