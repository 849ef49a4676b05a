"""Generations of one round: re-form a round's group after one of its workers was replaced,
through the round's own store, without a new rendezvous round; let a rank that arrived late
join the round's group the same way; end a round's generations when a rank leaves it for a
newer round.

A worker crash leaves the membership as it was: the crashed worker's agent starts a replacement
in the same round at once (``ELASTIC_REFILL=1``), and the ranks re-form the round's group under
a new *generation*, agreed on one key of the round's store (:data:`GENERATION_KEY`, under the
round's prefix; absent means generation 0, the round as the agent published it). Generation
``g`` forms under the store prefix ``<round prefix>/gen-<g>`` (generation 0 under the round's
own prefix, as before), so no two generations share a key.

Who moves the generation, always by one compare-and-set (so concurrent movers agree), and
how (:class:`Move`, kept in the key):

* a rank whose group of generation ``g`` failed: ``g`` → ``g + 1`` (a no-op when a peer did it);
* a replacement: the generation it reads → that plus one, since its predecessor may have
  formed the generation in use; a rank never shares a generation with its predecessor;
* a rank that arrives at generation ``g`` after it formed without it (a replacement that took
  long to start, a survivor that was slow): ``g`` → ``g + 1`` as a *regroup*. The members of
  ``g`` see the key move (:class:`GenerationWatch` in :mod:`elastic.worker.regroup`) and come
  at their next step boundary; ``g + 1`` closes once all of them are there.

A rank that leaves the round for a newer one first ends its generations
(:func:`leave_round`): the key keeps its generation and names the newer round, and no rank
moves it again, so the peers it leaves behind wait for the newer round instead of forming a
generation without it while it trains there.

A rank forming generation ``g`` abandons it as soon as the key moves past ``g`` and forms the
newest instead (:func:`elastic.worker.group.form_group`). The rendezvous is not involved: the
agents still report the failure and join the next round, which supersedes a generation that
has not formed yet and re-forms one that has. The point is the time between: with etcd slow or
electing a leader, training goes on as soon as the replacement is up.

Torch-free: the store is anything with ``check``/``get``/``compare_set`` (a ``PrefixStore``).
The key's value is versioned JSON, validated on read::

    {"v": 1, "generation": 3, "move": "regroup"}
    {"v": 1, "generation": 3, "move": "refill", "left_for": 9}
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

from elastic.worker.errors import WorkerEnvError
from elastic.worker.formation import ABANDON, VERDICT, encode_verdict, parse_verdict

__all__ = ["GENERATION_KEY", "REFILL_VAR", "GenerationState", "GenerationStore", "Move", "generation_key",
           "generation_prefix", "leave_round", "move_generation", "read_generation", "refill_from_env"]

GENERATION_KEY = "elastic-live/generation"
REFILL_VAR = "ELASTIC_REFILL"
"""Set to ``1`` by the agent for a worker that replaces one of the round it starts in."""
_MAX_BYTES = 200
_MAX_TRIES = 16
"""Compare-and-sets lost in a row before a move gives up (each loss means the key moved on)."""
_MAX_SCAN = 64
"""The most generations :func:`leave_round` looks through for one formed without the leaver."""


class GenerationStore(Protocol):
    def check(self, keys: list[str]) -> bool: ...
    def get(self, key: str) -> bytes: ...
    def compare_set(self, key: str, expected: str, desired: str) -> bytes: ...


class Move(enum.Enum):
    """How a generation came to be."""

    PUBLISHED = "published"
    """Generation 0: the round as the agent published it."""
    REFILL = "refill"
    """A rank's group failed, or a replacement started: the generation before may have lost a rank."""
    REGROUP = "regroup"
    """A rank arrived after the generation before formed without it; that one's members come
    at their next step boundary."""


@dataclass(frozen=True)
class GenerationState:
    """The round's generation, how it came to be, and whether the round was left for a newer one."""

    number: int
    move: Move = Move.PUBLISHED
    left_for: int | None = None
    """A rank left the round for this round: no generation of it forms any more."""
    raw: bytes = field(default=b"", compare=False)
    """The key's bytes as read (empty: absent), what a compare-and-set expects."""


def generation_prefix(round_prefix: str, generation: int) -> str:
    """The store prefix of ``generation`` of the round whose prefix is ``round_prefix``."""
    return round_prefix if generation == 0 else f"{round_prefix}/gen-{generation}"


def generation_key(generation: int, key: str) -> str:
    """``key`` of ``generation``, relative to the round's prefix."""
    return key if generation == 0 else f"gen-{generation}/{key}"


def read_generation(store: GenerationStore) -> GenerationState:
    """The round's generation now (generation 0 as published while the key is absent).

    Raises:
        ValueError: the key holds something that is not a generation (a hostile or broken peer).
    """
    if not store.check([GENERATION_KEY]):
        return GenerationState(0)
    return _decode(store.get(GENERATION_KEY))


def move_generation(store: GenerationStore, past: int, move: Move = Move.REFILL) -> GenerationState:
    """Move the generation from ``past`` to ``past + 1`` (as ``move``) unless it already moved;
    the state now: ``past + 1``, newer when a peer moved it further, or a round left.

    Raises:
        ValueError: the key holds something that is not a generation, or one below ``past``
            (the store was reset).
    """
    for _ in range(_MAX_TRIES):
        state = read_generation(store)
        if state.left_for is not None or state.number > past:
            return state
        if state.number < past:
            raise ValueError(f"the round's generation is {state.number}, not past {past}: its store was reset")
        desired = _encode(past + 1, move)
        if store.compare_set(GENERATION_KEY, state.raw.decode(), desired.decode()) == desired:
            return _decode(desired)
    raise ValueError(f"the round's generation kept changing while moving it past {past}")


def leave_round(store: Any, formed: int, rank: int, world_size: int, for_round: int) -> bool:
    """End the round's generations for ``for_round`` (no rank moves the key again; a generation
    still forming is abandoned); whether every generation formed after ``formed`` (the last
    this rank formed) has ``rank`` among its members, i.e. the round trained nowhere without it.

    Raises:
        ValueError: the key or a verdict holds garbage.
    """
    for _ in range(_MAX_TRIES):
        state = read_generation(store)
        if state.left_for is not None:
            break
        desired = _encode(state.number, state.move, for_round)
        if store.compare_set(GENERATION_KEY, state.raw.decode(), desired.decode()) == desired:
            state = _decode(desired)
            break
    else:
        return False
    if state.number - formed > _MAX_SCAN:
        return False
    for generation in range(formed + 1, state.number + 1):
        raw = store.compare_set(generation_key(generation, VERDICT), "", encode_verdict(ABANDON).decode())
        verdict = parse_verdict(raw, world_size)
        if verdict.go and rank not in verdict.members:
            return False
    return True


def refill_from_env(environ: Mapping[str, str]) -> bool:
    """Whether this worker replaces one of the round it starts in (``ELASTIC_REFILL``).

    Raises:
        WorkerEnvError: the variable holds something other than ``0`` or ``1``.
    """
    text = environ.get(REFILL_VAR, "") or "0"
    if text not in ("0", "1"):
        raise WorkerEnvError(f"{REFILL_VAR}={text!r} must be 0 or 1.")
    return text == "1"


def _encode(number: int, move: Move, left_for: int | None = None) -> bytes:
    fields: dict[str, Any] = {"v": 1, "generation": number, "move": move.value}
    if left_for is not None:
        fields["left_for"] = left_for
    return json.dumps(fields, separators=(",", ":")).encode()


def _decode(raw: bytes) -> GenerationState:
    try:
        if len(raw) > _MAX_BYTES:
            raise ValueError("too long")
        value = json.loads(raw.decode("utf-8"))
        if not isinstance(value, dict) or value.get("v") != 1:
            raise ValueError("not a version 1 object")
        number, left_for = value.get("generation"), value.get("left_for")
        if type(number) is not int or not 0 <= number < 2**62:
            raise ValueError("no generation number")
        if left_for is not None and (type(left_for) is not int or not 0 <= left_for < 2**62):
            raise ValueError("a bad round")
        return GenerationState(number, Move(value.get("move")), left_for, raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ValueError(f"the round's generation key holds {raw[:60]!r}, not a generation") from error
