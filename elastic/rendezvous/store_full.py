"""A store that refuses writes for lack of space is an outage for the join, not the job's end.

etcd raises its NOSPACE alarm when its database reaches ``--quota-backend-bytes`` (another tenant
filled it, or nobody compacts). From then on it refuses every write that costs space
(:class:`~backends.errors.StoreFullError`) until an operator compacts, defragments and disarms
the alarm; reads, deletes and lease renewals still work, so running workers train on. A join
cannot write, so it waits, retrying, and says why.

How long: the join timeout bounds waiting for *peers*, which cannot be judged while nobody can
write; the store's unavailability is what ``store_outage_timeout`` bounds (how long a running
member trains blind while the store does not answer). So while writes are refused a join does
not end before ``store_outage_timeout`` has passed since the first refusal, however short its
join timeout (:func:`refusal_deadline`); an operator paged about a full etcd gets the same time
whether the job's nodes were training or re-forming when it filled.

:class:`WriteRefusals` keeps the current run of refusals for one node: it logs once at the first
refusal and then every :data:`NOSPACE_LOG_INTERVAL` seconds (the error's message names the
etcdctl commands that end it), and :attr:`WriteRefusals.full` feeds ``/healthz`` and the
``elastic_store_nospace`` metric.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable

from backends.api import KVBackend
from backends.errors import BackendError, StoreFullError
from backends.txn import Compare, CompareOp, Put, Target, Txn

log = logging.getLogger(__name__)

NOSPACE_LOG_INTERVAL = 30.0
"""Seconds between two warnings that the store still refuses writes."""


def check_writable(backend: KVBackend, probe_key: str) -> None:
    """Ask the store whether it accepts writes, writing nothing: a transaction whose put never
    runs (its comparison cannot hold). etcd prices a transaction by its puts before it compares,
    so a full etcd refuses it; any other store or answer passes.

    A node that waits for a round only watches: when its join times out it checks this, since
    "nobody closed the round" may mean "nobody could write".

    Raises:
        StoreFullError: the store refuses writes for lack of space.
    """
    never = Compare(probe_key, Target.CREATE_REVISION, CompareOp.LESS, 0)
    try:
        backend.txn(Txn((never,), (Put(probe_key, b""),), ()))
    except StoreFullError:
        raise
    except BackendError:
        return


def refusal_deadline(join_deadline: float, refused_since: float, outage_timeout: float) -> float:
    """The deadline of a join whose writes the store has refused since ``refused_since``: the
    join's own, or ``store_outage_timeout`` after the first refusal if that is later. Pure."""
    return max(join_deadline, refused_since + outage_timeout)


class WriteRefusals:
    """The current run of writes the store refused for space, for one node (see the module docstring).

    Args:
        run_id, node_id: for the log lines.
        outage_timeout: ``store_outage_timeout``.
        clock: monotonic seconds.
    """

    def __init__(self, run_id: str, node_id: str, outage_timeout: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._run_id = run_id
        self._node_id = node_id
        self._outage_timeout = outage_timeout
        self._clock = clock
        self._since: float | None = None
        self._logged = -math.inf

    @property
    def full(self) -> bool:
        """Whether this node's last write was refused for space (no I/O)."""
        return self._since is not None

    def refused(self, error: StoreFullError, deadline: float) -> float:
        """A write was refused for space; returns the join's deadline (see :func:`refusal_deadline`)."""
        now = self._clock()
        if self._since is None:
            self._since = now
        extended = refusal_deadline(deadline, self._since, self._outage_timeout)
        if now - self._logged >= NOSPACE_LOG_INTERVAL:
            self._logged = now
            log.warning("Rendezvous %s: node %s: etcd is out of space for %.0fs and refuses writes; the join retries "
                        "until it accepts them (for up to %.0fs more; store_outage_timeout=%gs). %s", self._run_id,
                        self._node_id, now - self._since, max(extended - now, 0.0), self._outage_timeout, error)
        return extended

    def cleared(self) -> None:
        """A write went through: the store has space again."""
        if self._since is not None:
            log.warning("Rendezvous %s: node %s: etcd accepts writes again after %.0fs out of space", self._run_id,
                        self._node_id, self._clock() - self._since)
        self._since = None
        self._logged = -math.inf
