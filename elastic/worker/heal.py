"""Agree on the step after a group formed, and bring the ranks that are behind up to it.

Every rank all-gathers its :class:`~elastic.worker.decisions.Mark` (steps committed, and the
round it committed the last one in); :func:`~elastic.worker.decisions.plan_heal` picks the
lowest-ranked rank with the highest mark as the source and everyone below it as receivers;
the source encodes ``state_dict()`` and sends it point to point; each receiver loads it with
``load_state_dict``. Ranks that are level with the source do nothing. With HSDP
(``LiveOptions.hsdp``) each shard index heals on its own (:func:`~elastic.worker.decisions.plan_shard_heals`):
a rank's state is its own shard, sent by a rank holding the same one.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from elastic.worker.codec import encode_state
from elastic.worker.decisions import Mark, plan_heal, plan_shard_heals
from elastic.worker.group import FormedGroup
from elastic.worker.options import LiveOptions
from elastic.worker.transfer import receive_state, send_state, wire_device

__all__ = ["HealRole", "Healed", "heal"]


class HealRole(enum.Enum):
    SOURCE = "source"
    RECEIVER = "receiver"
    LEVEL = "level"
    """Neither: this rank was level with the source, or nobody needed the state."""


@dataclass(frozen=True)
class Healed:
    """The outcome of one heal on this rank."""

    mark: Mark
    """Where this rank stands after the heal (the source's mark, for every rank)."""
    role: HealRole
    steps: tuple[int, ...]
    """Every rank's step before the heal, by rank."""
    nbytes: int
    agreed_at: float
    done_at: float


    @property
    def step(self) -> int:
        return self.mark.step


def heal(formed: FormedGroup, mark: Mark, options: LiveOptions, state_dict: Callable[[], Any],
         load_state_dict: Callable[[Any], None], clock: Callable[[], float] = time.monotonic) -> Healed:
    """Agree on the step and transfer the state to the ranks behind ``mark``; where every rank stands after.

    Raises:
        GroupLost: a peer failed, or a newer round abandoned the group, during the heal.
        StateTransferError: the state cannot be encoded, or a received header is malformed or
            over its bounds (``LiveOptions.max_header_bytes``, ``max_state_bytes``).
    """
    group = formed.group
    mine = torch.tensor([mark.step, mark.round], dtype=torch.int64, device=wire_device(group))
    gathered = [torch.zeros_like(mine) for _ in range(formed.world_size)]
    formed.registry.launch([dist.all_gather(gathered, mine, group=group, async_op=True)]).wait()
    marks = [Mark(*(int(value) for value in pair.tolist())) for pair in gathered]
    agreed_at = clock()
    rank = formed.rank
    if options.hsdp:  # each shard index from a rank holding it (the round's ranks are node-major)
        shards = [member % formed.round.local_world_size for member in (formed.members or range(formed.world_size))]
        plan = plan_shard_heals(marks, shards, options.init_sync)[shards[rank]]
    else:
        plan = plan_heal(marks, options.init_sync)
    nbytes = 0
    role = HealRole.LEVEL
    if plan.source == rank:
        encoded = encode_state(state_dict(), options.coalesce_bytes, wire_device(group))
        nbytes = send_state(formed.registry, group, encoded, plan.receivers)
        role = HealRole.SOURCE
    elif rank in plan.receivers:
        assert plan.source is not None  # plan_heal names a source whenever it names receivers
        received = receive_state(formed.registry, group, plan.source, options.max_header_bytes, options.max_state_bytes)
        load_state_dict(received.state)
        nbytes = received.nbytes
        role = HealRole.RECEIVER
    return Healed(mark if plan.source is None else plan.mark, role, tuple(m.step for m in marks), nbytes, agreed_at, clock())
