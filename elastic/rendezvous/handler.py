"""The public rendezvous handler: joins rounds over any :class:`~backends.api.KVBackend`.

Protocol (DESIGN §3), per round ``r`` of one run:

1. A node holds one :class:`~backends.session.Session` (a lease) for its whole life.
2. It joins with one transaction (:func:`~elastic.rendezvous.transactions.join_txn`): put its
   own lease-bound key ``rounds/<r>/nodes/<node>``, claim ``state/closer/<r>`` if nobody holds
   it (else read the holder), count the round's joiners, and drop its key of an earlier round.
   The node watches ``state/`` from now first and reads after (a watch from a past revision
   waits for etcd's 100 ms catch-up loop); the watch lives as long as the handler. The first
   join is guarded: if the round record is the one the node expects (none, or the round it was
   last in), join the next round; either way read ``state/``. A wrong guess writes nothing and
   the node joins the round the read shows.
3. The node that created the claim is the *closer*. The join whose count reaches ``max_nodes``
   closes the round at once; below the maximum the closer, which alone watches every join,
   closes it at ``min_nodes`` once the last-call window has passed (and at the maximum only if
   the filling joiner did not within a lease TTL). A close is one transaction
   (:func:`~elastic.rendezvous.transactions.close_txn`): write ``state/round`` if it is still the
   record read, recording the members read at one revision, and drop the claim. Everyone else
   watches only ``state/``, where they see the round close, or the closer's claim vanish with
   its lease (then they claim it).
4. A node not in the closed round moves to round ``r + 1`` and is *waiting*; members see it
   through their :class:`~elastic.rendezvous.monitor.MembershipMonitor` and restart.
5. A member whose lease vanishes deletes its key; every member's monitor sees the DELETE. A
   node that deletes its key on purpose (it shuts down, is excluded, gives up) first leaves a
   short-lived note saying why (:mod:`~elastic.rendezvous.departures`), so the others can name
   why it is gone.
6. The job ends once (:mod:`elastic.rendezvous.job`): the first node whose workers all succeed
   writes ``state/finished`` (:meth:`RendezvousHandler.declare_finished`); every join and close
   compares it absent, so no round forms after it. Every join also compares the job identity
   record (``state/job``) the node checked before its first join (:mod:`elastic.rendezvous.gate`).

This module is the facade; each job has its module: :mod:`~elastic.rendezvous.membership`
(the session, the ``state/`` watch, the master port), :mod:`~elastic.rendezvous.joining`
(steps 2 and 4; the wait for the close is :mod:`~elastic.rendezvous.round_wait`, the writes of
the join key and closer claim :mod:`~elastic.rendezvous.join_writer`),
:mod:`~elastic.rendezvous.closing` (step 3), :mod:`~elastic.rendezvous.monitor` (step 5 and the
other changes of a running round) and :mod:`~elastic.rendezvous.barrier` (the exit barrier);
what they share (settings, store, keys, node, membership, clock) is one
:class:`~elastic.rendezvous.context.RendezvousContext`.
The decisions are the pure functions of :mod:`elastic.rendezvous.decisions` (forming a round),
:mod:`~elastic.rendezvous.round_events` (changes under a closed round) and
:mod:`~elastic.rendezvous.reconcile` (after a compacted watch).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from typing import Callable, Iterator

from backends.api import ABSENT, KVBackend
from backends.errors import BackendError
from backends.retry import RetryPolicy
from elastic.rendezvous import records
from elastic.rendezvous.api import MembershipChange, MembershipStatus, Rendezvous, RendezvousInfo
from elastic.rendezvous.barrier import ExitBarrier
from elastic.rendezvous.context import NodeSpec, RendezvousContext
from elastic.rendezvous.round_events import RoundView
from elastic.rendezvous.departures import Departure
from elastic.rendezvous.errors import RendezvousClosedError, RendezvousConnectionError, RendezvousStateError
from elastic.rendezvous.job import FinishedRecord, encode_finished
from elastic.rendezvous.joining import JOIN_RETRY, JoinLoop
from elastic.rendezvous.membership import Membership, default_node_id
from elastic.rendezvous.monitor import MembershipMonitor
from elastic.rendezvous.ports import PortReservation, reserve_port
from elastic.rendezvous.progress import WaitSnapshot
from elastic.rendezvous.reads import read_state
from elastic.rendezvous.records import RendezvousKeys
from elastic.rendezvous.settings import RendezvousSettings

__all__ = ["JOIN_RETRY", "NodeSpec", "RendezvousHandler", "default_node_id"]

log = logging.getLogger(__name__)


class RendezvousHandler(Rendezvous):
    """Joins rounds of one run and watches the closed round for membership changes.

    Args:
        settings: the run's settings. backend: an open key-value backend, closed on
            :meth:`shutdown` only if ``owns_backend``. release: called once on :meth:`shutdown`.
        node: this node: its address, id and workers (:class:`~elastic.rendezvous.context.NodeSpec`),
            published with every join.
        clock: monotonic clock; port_reserver: listens on the master port a join publishes
            (:mod:`elastic.rendezvous.ports`); retry: the backoff between tries of a step the
            store interrupted (the join timeout bounds them).

    Threads: one lock serialises every entry point that does I/O or changes state.
    :meth:`membership` and :meth:`progress` read one immutable value each, without the lock,
    so a metrics thread never waits behind a join that may take the whole join timeout.
    :meth:`shutdown` interrupts a join or barrier in another thread before taking the lock.
    Every public method raises only :class:`~elastic.rendezvous.errors.RendezvousError`s.
    """

    def __init__(
        self,
        settings: RendezvousSettings,
        backend: KVBackend,
        node: NodeSpec,
        *,
        owns_backend: bool = False,
        release: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        port_reserver: Callable[[str], PortReservation] = reserve_port,
        retry: RetryPolicy = JOIN_RETRY,
    ) -> None:
        self.settings = settings
        self.node = node
        self.keys = RendezvousKeys(settings.namespace, settings.run_id)
        self._backend = backend
        self._owns_backend = owns_backend
        self._release = release
        self._retry = retry
        self._lock = threading.RLock()
        self._monitor: MembershipMonitor | None = None
        self._change_callbacks: list[Callable[[], None]] = []
        self._membership = Membership(settings, backend, self.keys.state_prefix, node.node_id, node.addr,
                                      port_reserver, self._signal)
        ctx = RendezvousContext(settings, backend, self.keys, node, self._membership, clock)
        self._joining = JoinLoop(ctx, retry)
        self._barrier = ExitBarrier(ctx)
        self._finished = False  # this node's workers finished (it went through the exit barrier)
        self._closed_it = False  # this node closed the rendezvous: nobody waits for it any more

    # -- identity and snapshots (no lock, no I/O) ------------------------------------------------
    @property
    def run_id(self) -> str:
        return self.settings.run_id

    @property
    def node_id(self) -> str:
        return self.node.node_id

    @property
    def supports_exclusion(self) -> bool:
        return True

    def membership(self) -> MembershipStatus:
        """The current round's membership as last seen. No I/O, no lock."""
        monitor = self._monitor
        status = monitor.status if monitor is not None else MembershipStatus()
        return dataclasses.replace(status, store_outage=self._membership.outage, store_full=self._membership.store_full,
                                   held_until=self._membership.held_until)

    def on_change(self, callback: Callable[[], None]) -> None:
        self._change_callbacks.append(callback)

    def progress(self) -> WaitSnapshot | None:
        """What this node knows of the round it waits for (None when not joining). No I/O, no lock."""
        return self._joining.progress

    def on_progress(self, callback: Callable[[WaitSnapshot | None], None]) -> None:
        self._joining.on_progress(callback)

    # -- entry points (under the lock) -----------------------------------------------------------
    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round and block until it closes with this node in it.

        A store that fails or cannot be reached meanwhile does not end the join: each step is
        safe to repeat, so the join starts over from a fresh read, with backoff, until the join
        timeout (see :mod:`elastic.rendezvous.joining`).

        Raises:
            RendezvousClosedError: the rendezvous was closed for good, or this node shut down.
            RendezvousTimeoutError: no round included this node within the join timeout.
            RendezvousConnectionError: the backend failed for the whole join timeout, or refused
                (auth) in a way a retry cannot fix.
            RendezvousStateError: the state in the store is corrupt.
        """
        with self._lock, self._translated("joining"):
            self._stop_monitor()
            included = self._joining.join()
            closed = included.closed
            view = RoundView(self.keys, closed.record, self.node_id, self.settings.max_nodes, closed.revision)
            self._monitor = MembershipMonitor.open(
                self._backend, view, self._membership.state, self._changed,
                retrying=lambda open_watch: self._membership.retrying(open_watch, self._retry))
            self._membership.signal_if_lost()  # lost before the monitor existed
            listener = self._membership.take_listener(host=included.rank == 0)
        info = included.info(self.run_id, self.node_id, listener)
        log.info("Rendezvous %s: node %s is rank %d of %d in round %d (master %s:%d)", self.run_id, self.node_id,
                 info.group_rank, info.group_world_size, info.round, info.master_addr, info.master_port)
        return info

    def report_failure(self, at: float = 0.0) -> None:
        """This node's own workers failed in the current round (first exit at wall time ``at``):
        the next join carries it into the agreed restart count and the culprit. No I/O."""
        with self._lock:
            self._joining.report_failure(at)

    def exclude(self, cooldown: float, reason: str) -> None:
        """Leave the current round and mark this node excluded for ``cooldown`` seconds (a key
        bound to a lease of that TTL, so it vanishes by itself); the other members see this
        node's join key go and re-form without it. The next :meth:`next_rendezvous` joins again.

        Raises:
            RendezvousConnectionError: the backend could not be reached.
        """
        def mark() -> None:
            lease = self._backend.grant(cooldown).id
            self._backend.put(self.keys.excluded(self.node_id), records.encode_exclusion(reason, cooldown), lease=lease)

        with self._lock, self._translated("excluding itself"):
            self._stop_monitor()
            self._joining.leave(Departure.EXCLUDED, reason)
            self._membership.retrying(mark, self._retry)
        log.warning("Rendezvous %s: node %s is excluded for %gs: %s", self.run_id, self.node_id, cooldown, reason)

    def declare_finished(self) -> None:
        """This node's workers all succeeded: record the job's end (``state/finished``, written
        once: the first node wins) so that no round forms after it. A node that was never in a
        round has nothing to declare. The store is retried for the close timeout, not the join
        timeout: the workers are done, and an unreachable store only delays the exit.

        Raises:
            RendezvousConnectionError: the store did not answer within the close timeout.
        """
        with self._lock:
            last = self._joining.last
            if last is None:
                return
            record = FinishedRecord(self.node_id, last.record.round, time.time())
            with self._translated("recording the job's end"):
                result = self._membership.retrying(
                    lambda: self._backend.put_if(self.keys.finished, encode_finished(record), ABSENT), self._retry,
                    within=self.settings.close_timeout)
        if result.applied:
            log.info("Rendezvous %s: node %s finished the job in round %d: no round forms any more", self.run_id,
                     self.node_id, record.round)

    def finish(self, timeout: float) -> bool:
        """The exit barrier (see :mod:`elastic.rendezvous.barrier`): mark this member done and
        wait until every member is, or ``timeout``. True when every member finished in time.

        Raises:
            RendezvousConnectionError: the backend could not be reached.
        """
        with self._lock, self._translated("at the exit barrier"):
            self._finished = True
            last, lease_id = self._joining.last, self._membership.lease_id
            if last is None or lease_id is None:
                return True
            return self._barrier.finish(last.record, lease_id, timeout)

    def is_closed(self) -> bool:
        """Whether the rendezvous was closed for good, or the job finished (no round forms then
        either). Raises RendezvousConnectionError."""
        def closed() -> bool:
            state = read_state(self._backend, self.keys)
            return state.closed or state.finished is not None

        with self._lock, self._translated("reading the state"):
            return self._membership.retrying(closed, self._retry)

    def job_running(self) -> bool:
        """Whether a round has closed and the rendezvous is open (a join now interrupts running
        workers). One read; False when the store does not answer or its state is corrupt."""
        with self._lock:
            try:
                state = read_state(self._backend, self.keys)
            except (BackendError, RendezvousStateError):
                return False
            return state.round is not None and not state.closed and state.finished is None

    def set_closed(self, reason: str = RendezvousClosedError.JOB_FINISHED) -> None:
        """Close the rendezvous for every node (job finished or failed for good). Idempotent.
        Raises RendezvousConnectionError when the store does not answer within the close timeout
        (as torch's close: nothing waits on this node any more)."""
        record = records.encode_closed(records.ClosedRecord(reason))
        with self._lock, self._translated("closing the rendezvous"):
            self._membership.retrying(lambda: self._backend.put_if(self.keys.closed, record, ABSENT), self._retry,
                                      within=self.settings.close_timeout)
            self._closed_it = True

    def shutdown(self) -> bool:
        """Leave the rendezvous without closing it for the others (their monitors see us go, and
        a departure note says why: this node's workers finished, or its agent shut down).

        A join or exit barrier in progress in another thread is interrupted first (it raises
        RendezvousClosedError); then this takes the lock. Idempotent; never raises.
        """
        self._membership.interrupt()
        with self._lock:
            self._stop_monitor()
            # No note when nobody waits for this node, or the store does not answer (it would
            # only add a request timeout to the exit).
            quiet = self._closed_it or self._membership.outage > 0
            self._joining.leave(None if quiet else Departure.FINISHED if self._finished else Departure.LEFT)
            self._membership.close()
            if self._owns_backend:
                self._backend.close()
            release, self._release = self._release, None
            if release is not None:
                release()
            return True

    # -- helpers ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _translated(self, doing: str) -> Iterator[None]:
        """The one place backend errors become rendezvous errors (``raise ... from``)."""
        try:
            yield
        except BackendError as error:
            if self._membership.interrupted.is_set():
                raise RendezvousClosedError(f"Node {self.node_id} was shut down while {doing}.") from error
            raise RendezvousConnectionError(
                f"Rendezvous {self.run_id}: node {self.node_id}: the backend failed while {doing}: {error}"
            ) from error

    def _stop_monitor(self) -> None:
        monitor, self._monitor = self._monitor, None
        if monitor is not None:
            monitor.stop()

    def _changed(self) -> None:
        for callback in self._change_callbacks:
            callback()

    def _signal(self, change: MembershipChange, reason: str) -> None:
        """Tell the monitor of the round this node is in (if any) about a change the session saw."""
        monitor = self._monitor
        if monitor is not None:
            monitor.signal(change, reason)
