"""Generations of one round: re-form a round's group after one of its workers was replaced,
through the round's own store, without a new rendezvous round.

A worker crash leaves the membership as it was: the crashed worker's agent starts a replacement
in the same round at once (``ELASTIC_REFILL=1``), and the ranks re-form the round's group under
a new *generation*, agreed on one key of the round's store (:data:`GENERATION_KEY`, under the
round's prefix; absent means generation 0, the round as the agent published it). Generation
``g`` forms under the store prefix ``<round prefix>/gen-<g>`` (generation 0 under the round's
own prefix, as before), so no two generations share a key.

Who moves the generation, always by one compare-and-set (so concurrent movers agree):

* a rank whose group of generation ``g`` failed: ``g`` → ``g + 1`` (a no-op when a peer did it);
* a replacement: the generation it reads → that plus one, since its predecessor may have
  formed the generation in use; a rank never shares a generation with its predecessor.

A rank forming generation ``g`` abandons it as soon as the key moves past ``g`` and forms the
newest instead (:func:`elastic.worker.group.form_group`). The rendezvous is not involved: the
agents still report the failure and join the next round, which supersedes a generation that
has not formed yet and re-forms one that has. The point is the time between: with etcd slow or
electing a leader, training goes on as soon as the replacement is up.

Torch-free: the store is anything with ``check``/``get``/``compare_set`` (a ``PrefixStore``).
"""

from __future__ import annotations

from typing import Mapping, Protocol

from elastic.worker.errors import WorkerEnvError

__all__ = ["GENERATION_KEY", "REFILL_VAR", "GenerationStore", "current_generation", "generation_prefix",
           "move_generation", "refill_from_env"]

GENERATION_KEY = "elastic-live/generation"
REFILL_VAR = "ELASTIC_REFILL"
"""Set to ``1`` by the agent for a worker that replaces one of the round it starts in."""
_MAX_DIGITS = 12


class GenerationStore(Protocol):
    def check(self, keys: list[str]) -> bool: ...
    def get(self, key: str) -> bytes: ...
    def compare_set(self, key: str, expected: str, desired: str) -> bytes: ...


def generation_prefix(round_prefix: str, generation: int) -> str:
    """The store prefix of ``generation`` of the round whose prefix is ``round_prefix``."""
    return round_prefix if generation == 0 else f"{round_prefix}/gen-{generation}"


def current_generation(store: GenerationStore) -> int:
    """The round's generation now (0 while the key is absent).

    Raises:
        ValueError: the key holds something that is not a generation (a hostile or broken peer).
    """
    if not store.check([GENERATION_KEY]):
        return 0
    return _decode(store.get(GENERATION_KEY))


def move_generation(store: GenerationStore, past: int) -> int:
    """Move the generation from ``past`` to ``past + 1`` unless it already moved; the generation
    now (``past + 1``, or newer when a peer moved it further).

    Raises:
        ValueError: the key holds something that is not a generation.
    """
    value = _decode(store.compare_set(GENERATION_KEY, _encode(past), _encode(past + 1)))
    if value <= past:  # absent while ``past`` > 0 (compare_set echoes ``expected``), or gone back
        raise ValueError(f"the round's generation is {value}, not past {past}: its store was reset")
    return value


def refill_from_env(environ: Mapping[str, str]) -> bool:
    """Whether this worker replaces one of the round it starts in (``ELASTIC_REFILL``).

    Raises:
        WorkerEnvError: the variable holds something other than ``0`` or ``1``.
    """
    text = environ.get(REFILL_VAR, "") or "0"
    if text not in ("0", "1"):
        raise WorkerEnvError(f"{REFILL_VAR}={text!r} must be 0 or 1.")
    return text == "1"


def _encode(generation: int) -> str:
    return "" if generation == 0 else str(generation)


def _decode(raw: bytes) -> int:
    text = raw.decode("ascii", errors="replace")
    if not text:
        return 0
    if len(text) > _MAX_DIGITS or not text.isdigit():
        raise ValueError(f"the round's generation key holds {text[:40]!r}, not a generation")
    return int(text)
