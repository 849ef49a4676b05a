"""Rendezvous state as versioned JSON records, validated on read. Never pickle.

Key layout under ``<namespace>/<run_id>/``::

    state/round              RoundRecord of the last closed round (absent before round 0)
    state/closed             ClosedRecord once the rendezvous is closed for good
    state/finished           FinishedRecord of the first node whose workers all succeeded
                             (:mod:`elastic.rendezvous.job`): no round forms after it
    state/job                JobIdentity of the job that first joined this run id (its
                             fingerprint; :mod:`elastic.rendezvous.job`)
    state/closer/<r>         JoinRecord of the node that closes round r: created by the first
                             joiner in the same transaction as its join key (lease-bound)
    rounds/<r>/nodes/<node>  JoinRecord of a node that wants to be in round r (lease-bound)
    rounds/<r>/done/<node>   a member whose workers finished (the exit barrier; lease-bound)
    rounds/<r>/departed/<node>  why a node deleted its own join key of round r (a departure
                             note, bound to a short lease of its own: elastic.rendezvous.departures)

Every value is ``{"v": 2, ...}``; anything else read from the store raises
:class:`RendezvousStateError` naming the key and how to clear it. Version 2 added each node's
local world size and role, the join's failure report and the round's agreed restart count:
a version-1 agent would compute ranks from its own flags, so the versions never mix.

The round record is the one source of truth for what workers see (DESIGN §3.9): every
member derives its ranks, the world size, the master and the restart count from it alone
(:meth:`RoundRecord.layout_of`), so they are equal on every rank of an attempt.
"""

from __future__ import annotations

import functools
import math
import threading
import json
from dataclasses import dataclass
from typing import Any

from backends.untrusted import parse_json, quote
from elastic.rendezvous.errors import RendezvousStateError

FORMAT_VERSION = 2

MAX_RECORD_BYTES = 64 * 1024 * 1024
"""Records larger than this are corrupt (a 1000-member round record is about 60 KB)."""


@dataclass(frozen=True)
class RendezvousKeys:
    """Where one run's rendezvous lives in the store. The fixed keys are computed once (the
    handler compares every watch event with them)."""

    namespace: str
    run_id: str

    @functools.cached_property
    def namespace_prefix(self) -> str:
        """Every run's keys in this namespace (what docs/security.md grants a job's etcd user)."""
        return f"{self.namespace.rstrip('/')}/"

    @functools.cached_property
    def root(self) -> str:
        """Every key of this run: the rendezvous touches nothing outside it."""
        return f"{self.namespace_prefix}{self.run_id}/"

    @functools.cached_property
    def state_prefix(self) -> str:
        return self.root + "state/"

    @functools.cached_property
    def round(self) -> str:
        return self.state_prefix + "round"

    @functools.cached_property
    def closed(self) -> str:
        return self.state_prefix + "closed"

    @functools.cached_property
    def finished(self) -> str:
        """The job's end: who finished it first, in which round."""
        return self.state_prefix + "finished"

    @functools.cached_property
    def job(self) -> str:
        """The identity (fingerprint) of the job that owns this run id."""
        return self.state_prefix + "job"

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

    def departed(self, round_number: int, node_id: str) -> str:
        """The departure note of a node that deleted its join key of ``round_number`` on purpose:
        beside that key, so the watch that sees the key go saw the note first."""
        return f"{self.root}rounds/{round_number}/departed/{node_id}"

    def parse_departed_key(self, key: str) -> tuple[int, str] | None:
        """``(round, node_id)`` for a departure note of this run, else None."""
        return self._parse_round_key(key, "departed")

    def excluded(self, node_id: str) -> str:
        """A node excluded for a cooldown (a key bound to a lease of that TTL)."""
        return f"{self.root}excluded/{node_id}"

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


DEFAULT_ROLE = "default"


@dataclass(frozen=True)
class JoinRecord:
    """What a node publishes when it joins a round: who it is, where its workers can meet,
    how many workers it runs in which role, and whether its own workers failed in the round
    it leaves (``failed_round``; the closer turns that into the agreed restart count)."""

    node_id: str
    addr: str
    master_port: int
    local_world_size: int = 1
    role: str = DEFAULT_ROLE
    failed_round: int | None = None
    failed_at: float = 0.0
    """Wall time of the first failure of its workers in ``failed_round`` (orders the culprits)."""


@dataclass(frozen=True)
class Member:
    """One member of a closed round, in rank order inside :class:`RoundRecord`."""

    node_id: str
    addr: str
    master_port: int
    local_world_size: int = 1
    role: str = DEFAULT_ROLE


@dataclass(frozen=True)
class NodeLayout:
    """Where one member's workers sit in the attempt's world, as torchrun's
    ``_assign_worker_ranks`` places them: global ranks are the cumulative local world sizes in
    group-rank order, role ranks the same among the members of one role.

    Worker ``i`` of the node has ``RANK = base_rank + i`` and ``ROLE_RANK = role_base_rank + i``.
    """

    group_rank: int
    group_world_size: int
    local_world_size: int
    base_rank: int
    world_size: int
    role: str
    role_base_rank: int
    role_world_size: int


@dataclass(frozen=True)
class RoundRecord:
    """A closed round: its number, its members in group-rank order, the store revision at
    which the member list was read (members watch for departures from just after it), and the
    restart count agreed for the attempt it starts (restarts caused by worker failures)."""

    round: int
    members: tuple[Member, ...]
    members_revision: int = 0
    restart_count: int = 0
    culprit: str | None = None
    """The node whose workers failed first, when this round counts a failure restart."""

    @property
    def group_world_size(self) -> int:
        """How many nodes are members."""
        return len(self.members)

    @property
    def world_size(self) -> int:
        """How many workers the attempt has: the sum of the members' local world sizes."""
        return self._layouts[1]

    def rank_of(self, node_id: str) -> int | None:
        """The group rank of ``node_id``, or None if it is not a member. O(1)."""
        return self._ranks.get(node_id)

    def layout_of(self, node_id: str) -> NodeLayout | None:
        """Where ``node_id``'s workers sit in the world, or None if it is not a member."""
        rank = self.rank_of(node_id)
        return None if rank is None else self._layouts[0][rank]

    @functools.cached_property
    def _ranks(self) -> dict[str, int]:
        # Monitors look up every DELETE under the run; at 1000 members a scan per event adds up.
        return {member.node_id: rank for rank, member in enumerate(self.members)}

    @functools.cached_property
    def _layouts(self) -> tuple[tuple[NodeLayout, ...], int]:
        world = sum(member.local_world_size for member in self.members)
        role_sizes: dict[str, int] = {}
        for member in self.members:
            role_sizes[member.role] = role_sizes.get(member.role, 0) + member.local_world_size
        layouts, base, role_bases = [], 0, dict.fromkeys(role_sizes, 0)
        for rank, member in enumerate(self.members):
            layouts.append(NodeLayout(rank, len(self.members), member.local_world_size, base, world, member.role,
                                      role_bases[member.role], role_sizes[member.role]))
            base += member.local_world_size
            role_bases[member.role] += member.local_world_size
        return tuple(layouts), world


@dataclass(frozen=True)
class ClosedRecord:
    """The rendezvous was closed for good, and why."""

    reason: str


def encode_join(record: JoinRecord) -> bytes:
    body: dict[str, Any] = {"node": record.node_id, "addr": record.addr, "port": record.master_port,
                            "lws": record.local_world_size, "role": record.role}
    if record.failed_round is not None:
        body["failed"] = record.failed_round
        body["failed_at"] = record.failed_at
    return dump_record(body)


def encode_round(record: RoundRecord) -> bytes:
    members = [[m.node_id, m.addr, m.master_port, m.local_world_size, m.role] for m in record.members]
    body: dict[str, Any] = {"round": record.round, "members": members, "read_at": record.members_revision,
                            "restarts": record.restart_count}
    if record.culprit is not None:
        body["culprit"] = record.culprit
    return dump_record(body)


def encode_exclusion(reason: str, cooldown: float) -> bytes:
    return dump_record({"reason": reason, "cooldown": cooldown})


def encode_closed(record: ClosedRecord) -> bytes:
    return dump_record({"reason": record.reason})


def decode_join(key: str, raw: bytes) -> JoinRecord:
    """Raises RendezvousStateError when ``raw`` is not a valid v1 join record."""
    body = load_record(key, raw)
    node, addr, port = body.get("node"), body.get("addr"), body.get("port")
    lws, role, failed = body.get("lws"), body.get("role"), body.get("failed")
    if not (isinstance(node, str) and node and isinstance(addr, str) and _is_port(port)):
        raise corrupt_record(key, "a join record needs a node id, an address and a port")
    if not (is_count(lws) and lws > 0 and isinstance(role, str) and role):
        raise corrupt_record(key, "a join record needs a local world size >= 1 and a role")
    failed_at = body.get("failed_at", 0.0)
    if failed is not None and not is_count(failed):
        raise corrupt_record(key, "a join record's failed round must be a round number")
    if type(failed_at) not in (int, float) or not math.isfinite(failed_at):
        raise corrupt_record(key, "a join record's failure time must be a number")
    return JoinRecord(node, addr, port, lws, role, failed, float(failed_at))


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
    body = load_record(key, raw)
    number, members, read_at = body.get("round"), body.get("members"), body.get("read_at", 0)
    restarts, culprit = body.get("restarts"), body.get("culprit")
    if not (is_count(number) and is_count(read_at) and is_count(restarts) and isinstance(members, list)
            and members):
        raise corrupt_record(key, "a round record needs a round number >= 0, a non-empty member list, a read "
                            "revision and a restart count")
    decoded = []
    append = decoded.append
    shape = "[node id, address, port, local world size, role]"
    for entry in members:
        # The checks of _is_port inlined (type() is int also rules out bool): this loop runs
        # once per member, and function calls here were most of the decoding time.
        if type(entry) is not list or len(entry) != 5:
            raise corrupt_record(key, f"member entry {quote(entry)} is not {shape}")
        node_id, addr, port, lws, role = entry
        if (type(node_id) is not str or type(addr) is not str or type(port) is not int or not 0 < port < 65536
                or type(lws) is not int or lws < 1 or type(role) is not str or not role):
            raise corrupt_record(key, f"member entry {quote(entry)} is not {shape}")
        append(Member(node_id, addr, port, lws, role))
    if len({member.node_id for member in decoded}) != len(decoded):
        raise corrupt_record(key, "a node is listed twice")
    if culprit is not None and type(culprit) is not str:
        raise corrupt_record(key, "a round record's culprit must be a node id")
    return RoundRecord(number, tuple(decoded), read_at, restarts, culprit)


def decode_closed(key: str, raw: bytes) -> ClosedRecord:
    """Raises RendezvousStateError when ``raw`` is not a valid v1 closed record."""
    reason = load_record(key, raw).get("reason")
    if not isinstance(reason, str):
        raise corrupt_record(key, "a closed record needs a reason")
    return ClosedRecord(reason)


def dump_record(body: dict[str, Any]) -> bytes:
    return json.dumps({"v": FORMAT_VERSION, **body}, separators=(",", ":")).encode()


def load_record(key: str, raw: bytes) -> dict[str, Any]:
    try:
        body = parse_json(raw, max_bytes=MAX_RECORD_BYTES)
    except ValueError as error:  # also nesting too deep and oversized records: bad state, not a bug
        raise corrupt_record(key, str(error)) from error
    if not isinstance(body, dict):
        raise corrupt_record(key, "it is not a JSON object")
    version = body.get("v")
    if version != FORMAT_VERSION:
        raise RendezvousStateError(
            f"The rendezvous state at {quote(key)} has format version {quote(version)}; this etcd-elastic reads "
            f"version {FORMAT_VERSION}. Upgrade every node to the same etcd-elastic, or start the job "
            f"with a new --rdzv-id."
        )
    return body


def corrupt_record(key: str, problem: str) -> RendezvousStateError:
    """The error for a corrupt record; quotes of bad values in ``problem`` are already short."""
    return RendezvousStateError(
        f"The rendezvous state at {quote(key)} is corrupt: {problem}. Delete the key (for etcd: "
        f"`etcdctl del {quote(key)}`) or start the job with a new --rdzv-id."
    )


def _is_port(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536


def is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
