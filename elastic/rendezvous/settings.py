"""The engine's rendezvous settings: validated once, frozen, read from ``--rdzv-conf`` key/values.

Torch's names are accepted so a torchrun command line moves over unchanged: ``join_timeout``,
``last_call_timeout``, ``close_timeout``, ``keep_alive_interval`` / ``keep_alive_max_attempt``
(which, when ``lease_ttl`` is not given, set the lease TTL to their product, i.e. the time
torch would take to declare a node dead) and ``etcd_prefix``; torch's other keys (``timeout``,
``heartbeat_timeout``, ...) are mapped or noted by :func:`elastic.rendezvous.conf.from_torch`
before they get here. The connection keys (TLS, credentials, timeouts) belong to the backend
spec (:mod:`elastic.rendezvous.backend_spec`); the vocabulary of both is :mod:`elastic.rendezvous.conf`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Mapping, TypeVar

from elastic.rendezvous.conf import ConfValues, check_known_keys
from elastic.rendezvous.errors import RendezvousConfigError
from elastic.rendezvous.job import JobIdentity

ETCD_MIN_LEASE_TTL = 2.0
"""etcd refuses shorter leases (it rounds them up), so the TTL is never below it."""

DEFAULT_LEASE_TTL = 5.0

MAX_RUN_ID_CHARS = 128
"""Longest run id: it is one path component of the log and PID-file directories (255 bytes on
Linux, with the node id beside it) and a segment of every store key of the job."""


@dataclass(frozen=True)
class RendezvousSettings:
    """Everything the engine needs to know about one job's rendezvous.

    Raises (on construction):
        RendezvousConfigError: a value is out of range; the message says which and why.
    """

    run_id: str
    min_nodes: int
    max_nodes: int
    join_timeout: float = 600.0
    last_call_timeout: float = 30.0
    close_timeout: float = 30.0
    rejoin_timeout: float | None = None
    """How long a round after the first waits for the previous round's members once one of them
    rejoined, when that is sooner than the last call (None: only the last call). Meant for
    ``--live-recovery``, where members rejoin without stopping their workers: a node lost at once
    (its peers' collectives fail) then costs this, not the last call or its lease TTL."""
    lease_ttl: float = DEFAULT_LEASE_TTL
    namespace: str = "/elastic"
    max_node_failures: int = 0
    """Exclude a node after this many failure restarts in a row caused by its own workers (0: never)."""
    exclusion_cooldown: float = 600.0
    store_outage_timeout: float = 900.0
    """How long a member trains blind while the store does not answer (its lease holds until the
    server says otherwise, DESIGN §3.10) before it stops its workers with an error."""
    job_fingerprint: str = ""
    """``--rdzv-conf job_fingerprint``: replaces the fingerprint computed from the command ("": computed)."""
    already_finished_ok: bool = False
    """``--rdzv-conf already_finished_ok``: a node that arrives after the job finished (it joined no
    round of it) exits 0 instead of :data:`~elastic.rendezvous.job.ALREADY_FINISHED_EXIT_CODE`."""
    job: JobIdentity | None = field(default=None, compare=False)
    """This node's job (:mod:`elastic.rendezvous.job`), set by the launcher from its command line;
    None: no identity check (a node without one neither writes nor compares ``state/job``). Not
    compared: it describes this node's command, not how the run meets."""

    def __post_init__(self) -> None:
        # A plain name: it becomes a store key segment and a log directory, so '.' and '..'
        # (which would name the log root or its parent) are refused too.
        if len(self.run_id) > MAX_RUN_ID_CHARS:
            raise RendezvousConfigError(
                f"The run id ({len(self.run_id)} characters, {self.run_id[:40]!r}...) must be at most "
                f"{MAX_RUN_ID_CHARS} characters: it names a directory and a store key."
            )
        if not self.run_id or not re.fullmatch(r"[A-Za-z0-9._\-]+", self.run_id) or not self.run_id.strip("."):
            raise RendezvousConfigError(
                f"The run id ({self.run_id[:100]!r}) must be a plain name: letters, digits, '.', '_' and '-', "
                f"not only dots."
            )
        if self.min_nodes < 1:
            raise RendezvousConfigError(f"The minimum number of nodes ({self.min_nodes}) must be at least 1.")
        if self.max_nodes < self.min_nodes:
            raise RendezvousConfigError(
                f"The maximum number of nodes ({self.max_nodes}) must be at least the minimum ({self.min_nodes})."
            )
        if self.max_node_failures < 0 or self.max_node_failures == 1:
            raise RendezvousConfigError(
                f"The max node failures ({self.max_node_failures}) must be 0 (off) or at least 2: a node's first "
                f"failure cannot be told from the consequence of a peer's (the round that follows names the culprit)."
            )
        for name in ("join_timeout", "last_call_timeout", "close_timeout", "exclusion_cooldown", "store_outage_timeout"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise RendezvousConfigError(f"The {name.replace('_', ' ')} ({value}) must be a positive number of seconds.")
        if self.rejoin_timeout is not None and (not math.isfinite(self.rejoin_timeout) or self.rejoin_timeout <= 0):
            raise RendezvousConfigError(f"The rejoin timeout ({self.rejoin_timeout}) must be a positive number of seconds.")
        if not math.isfinite(self.lease_ttl) or self.lease_ttl < ETCD_MIN_LEASE_TTL:
            raise RendezvousConfigError(
                f"The lease TTL ({self.lease_ttl}) must be at least {ETCD_MIN_LEASE_TTL:g} seconds (etcd's minimum)."
            )
        if not self.namespace.startswith("/") or self.namespace.endswith("/") and self.namespace != "/":
            raise RendezvousConfigError(
                f"The namespace ({self.namespace!r}) must start with '/' and not end with one, e.g. /elastic."
            )

    @property
    def elastic(self) -> bool:
        """True when the job accepts a range of node counts."""
        return self.min_nodes != self.max_nodes


def settings_from_conf(run_id: str, min_nodes: int, max_nodes: int, conf: Mapping[str, str]) -> RendezvousSettings:
    """Build settings from ``--rdzv-conf`` key/values in our vocabulary (the engine's keys; backend
    keys are read into a backend spec by :mod:`elastic.rendezvous.backend_spec`). torch's own keys
    pass the check but are read only once :func:`~elastic.rendezvous.conf.from_torch` mapped them.

    Raises:
        RendezvousConfigError: an unknown key (the message lists the valid ones) or a bad value.
    """
    check_known_keys(conf)
    values = ConfValues(conf)
    default = RendezvousSettings(run_id, min_nodes, max_nodes)
    return RendezvousSettings(
        run_id, min_nodes, max_nodes,
        join_timeout=_given(values.seconds("join_timeout"), default.join_timeout),
        last_call_timeout=_given(values.seconds("last_call_timeout"), default.last_call_timeout),
        close_timeout=_given(values.seconds("close_timeout"), default.close_timeout),
        rejoin_timeout=values.seconds("rejoin_timeout"),
        lease_ttl=_lease_ttl(values, default.lease_ttl),
        namespace=_namespace(values, default.namespace),
        max_node_failures=_given(values.whole("max_node_failures", 0, "a whole number (0: off)"),
                                 default.max_node_failures),
        exclusion_cooldown=_given(values.seconds("exclusion_cooldown"), default.exclusion_cooldown),
        store_outage_timeout=_given(values.seconds("store_outage_timeout"), default.store_outage_timeout),
        job_fingerprint=values.text("job_fingerprint") or "",
        already_finished_ok=_given(values.switch("already_finished_ok"), default.already_finished_ok),
    )


def _lease_ttl(values: ConfValues, default: float) -> float:
    """``lease_ttl``, else torch's ``keep_alive_interval`` x ``keep_alive_max_attempt`` (5 s x 3), else the default."""
    lease_ttl = values.seconds("lease_ttl")
    if lease_ttl is not None:
        return lease_ttl
    if "keep_alive_interval" not in values and "keep_alive_max_attempt" not in values:
        return default
    interval = _given(values.seconds("keep_alive_interval"), 5.0)
    attempts = _given(values.seconds("keep_alive_max_attempt"), 3.0)
    return max(interval * attempts, ETCD_MIN_LEASE_TTL)


def _namespace(values: ConfValues, default: str) -> str:
    """``namespace`` (or torch's ``etcd_prefix``) with exactly one leading ``/``."""
    given = values.text("namespace") or values.text("etcd_prefix")
    return "/" + given.strip("/") if given else default


_T = TypeVar("_T")


def _given(value: _T | None, default: _T) -> _T:
    return default if value is None else value
