"""Rendezvous state as versioned JSON records, validated on read. Never pickle.

Key layout under ``<namespace>/<run_id>/``::

    state/round              RoundRecord of the last closed round (absent before round 0)
    state/closed             ClosedRecord once the rendezvous is closed for good
    state/closer/<r>         JoinRecord of the node that closes round r: created by the first
                             joiner in the same transaction as its join key (lease-bound)
    rounds/<r>/nodes/<node>  JoinRecord of a node that wants to be in round r (lease-bound)
    rounds/<r>/done/<node>   a member whose workers finished (the exit barrier; lease-bound)

Every value is ``{"v": 1, ...}``; anything else read from the store raises
:class:`RendezvousStateError` naming the key and how to clear it.
"""

from __future__ import annotations

import functools
import threading
import json
from dataclasses import dataclass
from typing import Any

from backends.untrusted import parse_json, quote
from elastic.rendezvous.errors import RendezvousStateError

FORMAT_VERSION = 1

MAX_RECORD_BYTES = 64 * 1024 * 1024
"""Records larger than this are corrupt (a 1000-member round record is about 60 KB)."""


@dataclass(frozen=True)
class RendezvousKeys:
    """Where one run's rendezvous lives in the store. The fixed keys are computed once (the
    handler compares every watch event with them)."""

    namespace: str
    run_id: str

    @functools.cached_property
    def root(self) -> str:
        return f"{self.namespace.rstrip('/')}/{self.run_id}/"

    @functools.cached_property
    def state_prefix(self) -> str:
        return self.root + "state/"

    @functools.cached_property
    def round(self) -> str:
        return self.state_prefix + "round"

    @functools.cached_property
    def closed(self) -> str:
        return self.state_prefix + "closed"

    def closer(self, round_number: int) -> str:
        """The claim of the node that closes round ``round_number``."""
        return f"{self.state_prefix}closer/{round_number}"

    @functools.cached_property
    def rounds_prefix(self) -> str:
        """Every round's keys (join and done keys), without ``state/``."""
        return self.root + "rounds/"

    def round_prefix(self, round_number: int) -> str:
        """Every key of round ``round_number``: its join keys and its done keys."""
        return f"{self.root}rounds/{round_number}/"

    def nodes_prefix(self, round_number: int) -> str:
        return f"{self.root}rounds/{round_number}/nodes/"

    def node(self, round_number: int, node_id: str) -> str:
        return self.nodes_prefix(round_number) + node_id

    def done_prefix(self, round_number: int) -> str:
        return f"{self.root}rounds/{round_number}/done/"

    def done(self, round_number: int, node_id: str) -> str:
        return self.done_prefix(round_number) + node_id

    def parse_node_key(self, key: str) -> tuple[int, str] | None:
        """``(round, node_id)`` for a node key of this run, else None."""
        return self._parse_round_key(key, "nodes")

    def parse_done_key(self, key: str) -> tuple[int, str] | None:
        """``(round, node_id)`` for a done key of this run, else None."""
        return self._parse_round_key(key, "done")

    def _parse_round_key(self, key: str, kind: str) -> tuple[int, str] | None:
        if not key.startswith(self.root + "rounds/"):
            return None
        parts = key[len(self.root + "rounds/"):].split("/")
        if len(parts) != 3 or parts[1] != kind or not parts[0].isdigit():
            return None
        return int(parts[0]), parts[2]


@dataclass(frozen=True)
class JoinRecord:
    """What a node publishes when it joins a round: who it is and where its workers can meet."""

    node_id: str
    addr: str
    master_port: int


@dataclass(frozen=True)
class Member:
    """One member of a closed round, in rank order inside :class:`RoundRecord`."""

    node_id: str
    addr: str
    master_port: int


@dataclass(frozen=True)
class RoundRecord:
    """A closed round: its number, its members in group-rank order, and the store revision at
    which the member list was read (members watch for departures from just after it)."""

    round: int
    members: tuple[Member, ...]
    members_revision: int = 0

    @property
    def world_size(self) -> int:
        return len(self.members)

    def rank_of(self, node_id: str) -> int | None:
        """The group rank of ``node_id``, or None if it is not a member. O(1)."""
        return self._ranks.get(node_id)

    @functools.cached_property
    def _ranks(self) -> dict[str, int]:
        # Monitors look up every DELETE under the run; at 1000 members a scan per event adds up.
        return {member.node_id: rank for rank, member in enumerate(self.members)}


@dataclass(frozen=True)
class ClosedRecord:
    """The rendezvous was closed for good, and why."""

    reason: str


def encode_join(record: JoinRecord) -> bytes:
    return _dump({"node": record.node_id, "addr": record.addr, "port": record.master_port})


def encode_round(record: RoundRecord) -> bytes:
    members = [[member.node_id, member.addr, member.master_port] for member in record.members]
    return _dump({"round": record.round, "members": members, "read_at": record.members_revision})


def encode_closed(record: ClosedRecord) -> bytes:
    return _dump({"reason": record.reason})


def decode_join(key: str, raw: bytes) -> JoinRecord:
    """Raises RendezvousStateError when ``raw`` is not a valid v1 join record."""
    body = _load(key, raw)
    node, addr, port = body.get("node"), body.get("addr"), body.get("port")
    if not (isinstance(node, str) and node and isinstance(addr, str) and _is_port(port)):
        raise _corrupt(key, "a join record needs a node id, an address and a port")
    return JoinRecord(node, addr, port)


def decode_round(key: str, raw: bytes) -> RoundRecord:
    """Raises RendezvousStateError when ``raw`` is not a valid v1 round record.

    Records are immutable, so the same bytes decode once per process: every handler in a
    process (an agent's handler and its monitor, or many simulated nodes) shares the result,
    and threads that ask at the same moment wait for the first one's decode instead of
    repeating it. A 1000-member record takes ~0.5 ms to decode.
    """
    raw = bytes(raw)
    with _decoding:
        return _decode_round_bytes(key, raw)


_decoding = threading.Lock()


@functools.lru_cache(maxsize=16)
def _decode_round_bytes(key: str, raw: bytes) -> RoundRecord:
    body = _load(key, raw)
    number, members, read_at = body.get("round"), body.get("members"), body.get("read_at", 0)
    if not (_is_count(number) and _is_count(read_at) and isinstance(members, list)):
        raise _corrupt(key, "a round record needs a round number >= 0, a member list and a read revision")
    decoded = []
    append = decoded.append
    for entry in members:
        # The checks of _is_port inlined (type() is int also rules out bool): this loop runs
        # once per member, and function calls here were most of the decoding time.
        if type(entry) is not list or len(entry) != 3:
            raise _corrupt(key, f"member entry {quote(entry)} is not [node id, address, port]")
        node_id, addr, port = entry
        if type(node_id) is not str or type(addr) is not str or type(port) is not int or not 0 < port < 65536:
            raise _corrupt(key, f"member entry {quote(entry)} is not [node id, address, port]")
        append(Member(node_id, addr, port))
    if len({member.node_id for member in decoded}) != len(decoded):
        raise _corrupt(key, "a node is listed twice")
    return RoundRecord(number, tuple(decoded), read_at)


def decode_closed(key: str, raw: bytes) -> ClosedRecord:
    """Raises RendezvousStateError when ``raw`` is not a valid v1 closed record."""
    reason = _load(key, raw).get("reason")
    if not isinstance(reason, str):
        raise _corrupt(key, "a closed record needs a reason")
    return ClosedRecord(reason)


def _dump(body: dict[str, Any]) -> bytes:
    return json.dumps({"v": FORMAT_VERSION, **body}, separators=(",", ":")).encode()


def _load(key: str, raw: bytes) -> dict[str, Any]:
    try:
        body = parse_json(raw, max_bytes=MAX_RECORD_BYTES)
    except ValueError as error:  # also nesting too deep and oversized records: bad state, not a bug
        raise _corrupt(key, str(error)) from error
    if not isinstance(body, dict):
        raise _corrupt(key, "it is not a JSON object")
    version = body.get("v")
    if version != FORMAT_VERSION:
        raise RendezvousStateError(
            f"The rendezvous state at {quote(key)} has format version {quote(version)}; this etcd-elastic reads "
            f"version {FORMAT_VERSION}. Upgrade every node to the same etcd-elastic, or start the job "
            f"with a new --rdzv-id."
        )
    return body


def _corrupt(key: str, problem: str) -> RendezvousStateError:
    """The error for a corrupt record; quotes of bad values in ``problem`` are already short."""
    return RendezvousStateError(
        f"The rendezvous state at {quote(key)} is corrupt: {problem}. Delete the key (for etcd: "
        f"`etcdctl del {quote(key)}`) or start the job with a new --rdzv-id."
    )


def _is_port(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
