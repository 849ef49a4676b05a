"""Rendezvous settings: validated once, frozen, parsed from ``--rdzv-conf`` key/values.

Torch's names are accepted so a torchrun command line moves over unchanged: ``join_timeout``,
``last_call_timeout``, ``close_timeout``, ``keep_alive_interval`` / ``keep_alive_max_attempt``
(which, when ``lease_ttl`` is not given, set the lease TTL to their product, i.e. the time
torch would take to declare a node dead), ``heartbeat``, ``read_timeout``, ``is_host``,
``store_type``, and the etcd TLS keys ``cacert``/``cert``/``key``/``protocol``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Mapping

from elastic.rendezvous.errors import RendezvousConfigError

ETCD_MIN_LEASE_TTL = 2.0
"""etcd refuses shorter leases (it rounds them up), so the TTL is never below it."""

DEFAULT_LEASE_TTL = 5.0

#: rdzv-conf keys that configure the engine itself, with their meaning.
ENGINE_KEYS = {
    "join_timeout": "seconds a node waits for a round to include it (default 600)",
    "last_call_timeout": "seconds to wait for more nodes once min_nodes have joined (default 30)",
    "close_timeout": "seconds to wait for a round to be closed by its closer (default 30)",
    "lease_ttl": "seconds after which a silent node is declared dead (default 5, at least 2)",
    "keep_alive_interval": "torch's heartbeat interval; lease_ttl = interval x keep_alive_max_attempt",
    "keep_alive_max_attempt": "torch's missed-heartbeat count (default 3)",
    "heartbeat": "torch's heartbeat timeout; accepted and ignored (liveness is the lease)",
    "namespace": "key prefix under which the rendezvous lives (default /elastic)",
    "max_node_failures": "exclude a node whose own workers caused this many failure restarts in a row (default 0: off)",
    "exclusion_cooldown": "seconds an excluded node stays out before it rejoins (default 600)",
    "store_outage_timeout": "seconds a node trains on while the store does not answer, before it stops its workers "
                            "(default 900)",
    "etcd_prefix": "alias of namespace (torch's etcd rendezvous)",
}

#: rdzv-conf keys passed through to the backend (connection options), with their meaning.
BACKEND_KEYS = {
    "cacert": "CA bundle to verify the etcd server (implies TLS)",
    "cert": "client certificate for etcd TLS",
    "key": "client private key for etcd TLS",
    "protocol": "http or https (torch's etcd rendezvous)",
    "user": "etcd user name",
    "password": "etcd password",
    "password_file": "file holding the etcd password",
    "token": "shared token of the built-in TCP store",
    "token_file": "file holding the TCP store token",
    "etcd_transport": "removed (the etcd client always uses grpcio); 'grpcio' is still accepted",
    "max_response_bytes": "largest etcd response the client accepts, in bytes (default 33554432, 32 MiB)",
    "dial_timeout": "seconds to establish a connection",
    "request_timeout": "seconds one backend request may take",
    "read_timeout": "torch's c10d store timeout; alias of request_timeout",
    "is_host": "c10d: whether this node hosts the built-in store (default: decided by address)",
    "store_type": "c10d: accepted for torch compatibility (only 'tcp')",
    "insecure_open_store": "c10d: 1 lets the host serve its store off loopback without a token, as torchrun does",
}


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
    lease_ttl: float = DEFAULT_LEASE_TTL
    namespace: str = "/elastic"
    max_node_failures: int = 0
    """Exclude a node after this many failure restarts in a row caused by its own workers (0: never)."""
    exclusion_cooldown: float = 600.0
    store_outage_timeout: float = 900.0
    """How long a member trains blind while the store does not answer (its lease holds until the
    server says otherwise, DESIGN §3.10) before it stops its workers with an error."""
    backend_options: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        # A plain name: it becomes a store key segment and a log directory, so '.' and '..'
        # (which would name the log root or its parent) are refused too.
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


def parse_rdzv_conf(text: str | list[str] | tuple[str, ...]) -> dict[str, str]:
    """Parse ``k=v,k2=v2`` (or several such strings) into a dict; later keys win.

    Raises:
        RendezvousConfigError: an entry is not ``key=value``.
    """
    parts = [text] if isinstance(text, str) else list(text)
    config: dict[str, str] = {}
    for part in parts:
        for item in part.split(","):
            item = item.strip()
            if not item:
                continue
            key, equals, value = item.partition("=")
            key = key.strip().replace("-", "_")
            if not equals or not key:
                raise RendezvousConfigError(
                    f"The rendezvous option {item!r} is not key=value; expected e.g. --rdzv-conf join_timeout=900,lease_ttl=5."
                )
            config[key] = value.strip()
    return config


def settings_from_conf(run_id: str, min_nodes: int, max_nodes: int, conf: Mapping[str, str]) -> RendezvousSettings:
    """Build settings from ``--rdzv-conf`` key/values; backend keys are kept in ``backend_options``.

    Raises:
        RendezvousConfigError: an unknown key (the message lists the valid ones) or a bad value.
    """
    unknown = sorted(set(conf) - set(ENGINE_KEYS) - set(BACKEND_KEYS))
    if unknown:
        valid = ", ".join(sorted(ENGINE_KEYS) + sorted(BACKEND_KEYS))
        raise RendezvousConfigError(f"Unknown rendezvous option(s) {', '.join(unknown)}; valid options are: {valid}.")
    engine: dict[str, object] = {}
    for name in ("join_timeout", "last_call_timeout", "close_timeout", "exclusion_cooldown", "store_outage_timeout"):
        if name in conf:
            engine[name] = _seconds(conf, name)
    if "max_node_failures" in conf:
        text = conf["max_node_failures"]
        if not text.isdigit():
            raise RendezvousConfigError(f"The rendezvous option max_node_failures={text[:100]!r} must be a whole number "
                                        f"(0: off).")
        engine["max_node_failures"] = int(text)
    if "lease_ttl" in conf:
        engine["lease_ttl"] = _seconds(conf, "lease_ttl")
    elif "keep_alive_interval" in conf or "keep_alive_max_attempt" in conf:
        interval = _seconds(conf, "keep_alive_interval") if "keep_alive_interval" in conf else 5.0
        attempts = _seconds(conf, "keep_alive_max_attempt") if "keep_alive_max_attempt" in conf else 3.0
        engine["lease_ttl"] = max(interval * attempts, ETCD_MIN_LEASE_TTL)
    namespace = conf.get("namespace") or conf.get("etcd_prefix")
    if namespace:
        engine["namespace"] = "/" + namespace.strip("/")
    backend_options = {key: value for key, value in conf.items() if key in BACKEND_KEYS}
    return RendezvousSettings(run_id, min_nodes, max_nodes, backend_options=backend_options, **engine)  # type: ignore[arg-type]


def _seconds(conf: Mapping[str, str], name: str) -> float:
    text = conf[name]
    try:
        value = float(text)
    except ValueError:
        raise RendezvousConfigError(f"The rendezvous option {name}={text!r} must be a number of seconds.") from None
    if not math.isfinite(value) or value <= 0:
        raise RendezvousConfigError(f"The rendezvous option {name}={text!r} must be a positive number.")
    return value
