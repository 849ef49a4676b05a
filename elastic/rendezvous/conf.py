"""``--rdzv-conf``: its vocabulary, its ``K=V,...`` syntax, and typed readers of its values.

Two tables name our keys: :data:`ENGINE_KEYS`, read into
:class:`~elastic.rendezvous.settings.RendezvousSettings`, and :data:`BACKEND_KEYS`, read into a
backend spec (:mod:`elastic.rendezvous.backend_spec`); a backend key the chosen backend does not
use (``token`` with etcd) is accepted and unused. Two more name the keys torch 2.13's rendezvous
handlers read that are not ours: :data:`TORCH_ALIASES` (another name for one of ours) and
:data:`NO_EFFECT_KEYS` (accepted with a note saying why nothing changes); ``timeout`` is either,
by backend. :func:`from_torch` turns a command line's or torchrun's key/values into ours; it
is the one mapping the CLI and the torchrun plugin share. Any other key is an error.

:class:`ConfValues` is the one place a value's text becomes a number, a switch or a choice;
a bad value raises :class:`RendezvousConfigError` with one line naming ``key=value`` and the
accepted forms. This module imports neither torch nor a backend client.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from elastic.rendezvous.errors import RendezvousConfigError

#: rdzv-conf keys that configure the engine itself, with their meaning.
ENGINE_KEYS = {
    "join_timeout": "seconds a node waits for a round to include it (default 600)",
    "last_call_timeout": "seconds to wait for more nodes once min_nodes have joined (default 30)",
    "rejoin_timeout": "seconds a re-formed round waits for the previous round's members once one rejoined, when "
                      "sooner than the last call (default: off; for --live-recovery)",
    "close_timeout": "seconds closing the rendezvous or recording the job's end may retry the store (default 30)",
    "lease_ttl": "seconds after which a silent node is declared dead (default 5, at least 2)",
    "keep_alive_interval": "torch's heartbeat interval; lease_ttl = interval x keep_alive_max_attempt",
    "keep_alive_max_attempt": "torch's missed-heartbeat count (default 3)",
    "namespace": "key prefix under which the rendezvous lives (default /elastic)",
    "max_node_failures": "exclude a node whose own workers caused this many failure restarts in a row (default 0: off)",
    "exclusion_cooldown": "seconds an excluded node stays out before it rejoins (default 600)",
    "store_outage_timeout": "seconds a node trains on while the store does not answer, before it stops its workers "
                            "(default 900)",
    "etcd_prefix": "alias of namespace (torch's etcd rendezvous)",
    "job_fingerprint": "name of the job on every node; replaces the fingerprint of the command that keeps another "
                       "job with the same --rdzv-id out (default: the script or module and its option names)",
    "already_finished_ok": "1: a node that arrives after its --rdzv-id's job finished exits 0, not 3 (default 0)",
}

#: rdzv-conf keys that configure the backend connection, with their meaning.
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
    "insecure_open_store": "c10d: 1 lets the host serve its store off loopback without a token, as torchrun does",
}

#: Keys still accepted for old command lines but no longer documented (``--help`` leaves them out).
REMOVED_KEYS = frozenset({"etcd_transport"})

#: torch 2.13's names for keys of ours (its etcd-v2 backend's TLS options).
TORCH_ALIASES = {"ca_cert": "cacert", "ssl_cert": "cert", "ssl_cert_key": "key"}

_LIVENESS = "liveness here is the node's lease (lease_ttl, or keep_alive_interval x keep_alive_max_attempt)"

#: Keys torch's handlers read that change nothing here, with the reason the note gives.
NO_EFFECT_KEYS = {
    "heartbeat_timeout": f"torch's dynamic rendezvous reads it as its keep-alive deadline; {_LIVENESS}",
    "heartbeat": f"torch documents it for its dynamic rendezvous but reads heartbeat_timeout; {_LIVENESS}",
    "rank": "torchrun's static rendezvous takes it from --node-rank; set --node-rank",
    "use_libuv": "older torch's c10d store switch (torch 2.13 reads USE_LIBUV from the environment); "
                 "the built-in store has no libuv mode",
    "store_type": "only torch's c10d rendezvous reads it, and the built-in store is always a TCP store "
                  "(store_type=tcp)",
}

TIMEOUT_KEY = "timeout"
"""torch's rendezvous timeout (torchrun's launcher always sets it, 900 by default): the etcd
rendezvous's join deadline, our ``join_timeout`` (which wins when both are given). Backends
whose torch handler does not read it that way are in :data:`TIMEOUT_NO_EFFECT`."""

#: The backends (by torch's name for them) with which ``timeout`` has no effect, and why.
TIMEOUT_NO_EFFECT = {
    "c10d": "torch's c10d rendezvous does not read it either; its join deadline is join_timeout",
    "static": "the static backend waits for no rendezvous (torch's static one uses it as its store's timeout)",
}

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


_QUOTES = ("'", '"')


def unquote_conf(text: str) -> str | None:
    """``'k=v,k2=v2'`` without its quotes, or None when ``text`` is not wrapped in one matching pair.

    A shell removes the quotes of ``--rdzv-conf='join_timeout=5,timeout=5'``; a Kubernetes
    ``args:`` list (or torch's own launcher tests) passes them on, and torchrun runs such a line.
    Only one pair of the same quote around the whole value, with no quote inside, is taken off:
    ``'a=1`` or ``'a=1"`` stay as they are and are refused as typos would be.
    """
    stripped = text.strip()
    if len(stripped) < 2 or stripped[0] not in _QUOTES or stripped[-1] != stripped[0]:
        return None
    inner = stripped[1:-1]
    return None if any(quote in inner for quote in _QUOTES) else inner


def parse_rdzv_conf(text: str | Sequence[str]) -> dict[str, str]:
    """Parse ``k=v,k2=v2`` (or several such strings) into a dict; later keys win; ``-`` in a key is ``_``.

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


def valid_keys() -> list[str]:
    """Every key ``--rdzv-conf`` accepts: ours, then torch's that are not ours, each sorted."""
    torch_only = {*TORCH_ALIASES, *NO_EFFECT_KEYS, TIMEOUT_KEY}
    return sorted({*ENGINE_KEYS, *BACKEND_KEYS}) + sorted(torch_only)


def check_known_keys(conf: Mapping[str, str]) -> None:
    """Refuse keys that are neither ours nor read by a torch handler (:func:`valid_keys`).

    Raises:
        RendezvousConfigError: an unknown key; the message lists the valid ones.
    """
    valid = valid_keys()
    unknown = sorted(set(conf) - set(valid))
    if unknown:
        listed = [key for key in valid if key not in REMOVED_KEYS]
        raise RendezvousConfigError(
            f"Unknown rendezvous option(s) {', '.join(unknown)}; valid options are: {', '.join(listed)}."
        )


@dataclass(frozen=True)
class OurConf:
    """``--rdzv-conf`` in our vocabulary: the key/values our readers take, and one note per key
    given that has no effect here (``timeout=5 has no effect: ...``), to be said once at start."""

    values: Mapping[str, str]
    notes: tuple[str, ...] = ()


def from_torch(conf: Mapping[str, str], backend: str) -> OurConf:
    """Map torch's keys onto ours: aliases renamed (our own name wins when both are given),
    ``timeout`` to ``join_timeout`` unless ``backend`` (torch's name: ``c10d`` for a standalone
    run) is in :data:`TIMEOUT_NO_EFFECT`, and the keys of :data:`NO_EFFECT_KEYS` dropped with a note.

    Raises:
        RendezvousConfigError: an unknown key (the message lists the valid ones), or a
            ``store_type`` other than ``tcp`` for the built-in store.
    """
    check_known_keys(conf)
    values = {key: value for key, value in conf.items() if key in ENGINE_KEYS or key in BACKEND_KEYS}
    notes = []
    for key, value in conf.items():
        if key in TORCH_ALIASES:
            values.setdefault(TORCH_ALIASES[key], value)
        elif key == TIMEOUT_KEY and backend not in TIMEOUT_NO_EFFECT:
            values.setdefault("join_timeout", value)
        elif key == TIMEOUT_KEY:
            notes.append(_no_effect(key, value, TIMEOUT_NO_EFFECT[backend]))
        elif key in NO_EFFECT_KEYS:
            _check_store_type(key, value, backend)
            notes.append(_no_effect(key, value, NO_EFFECT_KEYS[key]))
    return OurConf(values, tuple(notes))


def _no_effect(key: str, value: str, why: str) -> str:
    return f"--rdzv-conf {key}={value[:100]} has no effect: {why}"


def _check_store_type(key: str, value: str, backend: str) -> None:
    """A c10d file store (``store_type=file``) cannot be had here; other backends never read the key."""
    if key == "store_type" and backend in ("c10d", "tcp") and value.strip().lower() != "tcp":
        raise RendezvousConfigError(
            f"The rendezvous option store_type={value[:100]!r} is not supported: the built-in store is a TCP "
            "store (torch's c10d file store has no equivalent here); drop store_type or set it to tcp."
        )


@dataclass(frozen=True)
class ConfValues:
    """Typed readers over parsed ``--rdzv-conf`` key/values; each returns None for an absent key.

    Every reader raises :class:`RendezvousConfigError` for a value it cannot take, with one line
    naming ``key=value`` (cut to 100 characters) and the accepted forms.
    """

    values: Mapping[str, str]

    def __contains__(self, key: object) -> bool:
        return key in self.values

    def text(self, key: str) -> str | None:
        return self.values.get(key)

    def seconds(self, key: str) -> float | None:
        """A positive, finite number of seconds."""
        text = self.values.get(key)
        if text is None:
            return None
        try:
            value = float(text)
        except ValueError:
            raise self._bad(key, "a number of seconds") from None
        if not math.isfinite(value) or value <= 0:
            raise self._bad(key, "a positive number")
        return value

    def whole(self, key: str, minimum: int, forms: str) -> int | None:
        """A whole number >= ``minimum``; ``forms`` says what is accepted (``a whole number (0: off)``)."""
        text = self.values.get(key)
        if text is None:
            return None
        if not text.isdigit() or int(text) < minimum:
            raise self._bad(key, forms)
        return int(text)

    def switch(self, key: str) -> bool | None:
        """1/true/yes/on or 0/false/no/off (any case)."""
        text = self.values.get(key)
        if text is None:
            return None
        word = text.strip().lower()
        if word not in _TRUE + _FALSE:
            raise self._bad(key, "1 or 0 (true or false)")
        return word in _TRUE

    def choice(self, key: str, choices: Sequence[str]) -> str | None:
        """One of ``choices`` (any case; returned lower-cased)."""
        text = self.values.get(key)
        if text is None:
            return None
        word = text.strip().lower()
        if word not in choices:
            raise self._bad(key, f"one of {', '.join(choices)}")
        return word

    def _bad(self, key: str, forms: str) -> RendezvousConfigError:
        return RendezvousConfigError(f"The rendezvous option {key}={self.values[key][:100]!r} must be {forms}.")
