"""Form the default process group of one round from its store, and leave it.

Forming is interruptible up to the moment every rank has committed to the round: the store is
connected in a helper thread, and the ranks meet at a barrier on the round's store whose
outcome is one compare-and-set (``verdict``: ``go`` once all arrived, ``abandon`` when a rank
saw a newer round first), so either every rank of the round calls ``init_process_group`` or
none does, and no rank waits in C++ for a peer that went to a newer round.

Within a round the ranks form one *generation* at a time (:mod:`elastic.worker.refill`): the
caller says which (join the current one, or move past one), and a barrier abandons its
generation as soon as the round's generation key moves past it, for the newest.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from elastic.worker.channel import RoundMailbox
from elastic.worker.errors import CollectiveFailed, NoRoundError, Superseded
from elastic.worker.fence import CommitFence
from elastic.worker.guard import Graveyard, OpRegistry
from elastic.worker.options import LiveOptions
from elastic.worker.refill import GenerationStore, current_generation, generation_prefix
from elastic.worker.rounds import Round

log = logging.getLogger(__name__)

__all__ = ["FormedGroup", "form_group", "leave_group", "pick_backend"]

ARRIVED = "elastic-live/arrived"
VERDICT = "elastic-live/verdict"
GO = b"go"
ABANDON = b"abandon"
_MAX_POLL = 0.02


@dataclass
class FormedGroup:
    """The group of one round, in use, and the registry of its collectives."""

    round: Round
    group: dist.ProcessGroup
    registry: OpRegistry
    backend: str
    generation: int = 0


def pick_backend(options: LiveOptions) -> str:
    if options.backend is not None:
        return options.backend
    return "nccl" if torch.cuda.is_available() else "gloo"


def form_group(round_: Round, options: LiveOptions, mailbox: RoundMailbox, label: str,
               clock: Callable[[], float] = time.monotonic, fenced: bool = True,
               pick: Callable[[GenerationStore], int] = current_generation,
               wait_until: float | None = None) -> FormedGroup:
    """Form the default process group of ``round_``; ``fenced``: judge completions after a stall
    (:mod:`elastic.worker.fence`; only with an agent that publishes to ``mailbox``); ``pick``:
    the generation to form, given the round's store (default: the current one); ``wait_until``:
    give up on the barrier then, if before the form timeout.

    Raises:
        Superseded: a newer round arrived before every rank committed to this one.
        CollectiveFailed: the round's store or a peer failed while forming.
        NoRoundError: not every rank arrived within the form timeout.
    """
    deadline = clock() + options.form_timeout
    if wait_until is not None:
        deadline = min(deadline, wait_until)
    client = _connect(round_, options, mailbox, clock)
    base = dist.PrefixStore(round_.store_prefix, client)
    generation = _generation(round_, lambda: pick(base))
    while True:
        store = dist.PrefixStore(generation_prefix(round_.store_prefix, generation), client)
        moved = _Moved(round_, base, generation)
        try:
            _barrier(store, round_, options, mailbox, deadline, clock, moved)
            break
        except _GenerationMoved:
            generation = moved.newest
    backend = pick_backend(options)
    try:
        dist.init_process_group(backend, store=store, rank=round_.rank, world_size=round_.world_size,
                                timeout=timedelta(seconds=options.collective_timeout))
    except RuntimeError as error:
        raise CollectiveFailed(f"round {round_.round}: init_process_group failed: {error}", round_.round) from error
    fence = CommitFence(mailbox, options.interrupt_grace, options.collective_timeout, label, clock) if fenced else None
    return FormedGroup(round_, dist.group.WORLD, OpRegistry(round_.round, label, clock, fence), backend, generation)


class _GenerationMoved(Exception):
    """The generation being formed was abandoned for a newer one (internal to form_group)."""


class _Moved:
    """Whether the round's generation moved past ``generation`` (remembering the newest seen)."""

    def __init__(self, round_: Round, base: Any, generation: int) -> None:
        self._round, self._base, self.generation, self.newest = round_, base, generation, generation

    def __call__(self) -> bool:
        self.newest = _generation(self._round, lambda: current_generation(self._base))
        return self.newest > self.generation


def _generation(round_: Round, read: Callable[[], int]) -> int:
    try:
        return read()
    except RuntimeError as error:  # torch's DistError family: the store went away
        raise CollectiveFailed(f"round {round_.round}: its store failed reading the generation: {error}",
                               round_.round) from error
    except ValueError as error:
        raise CollectiveFailed(f"round {round_.round}: {error}", round_.round) from error


def _connect(round_: Round, options: LiveOptions, mailbox: RoundMailbox, clock: Callable[[], float]) -> Any:
    """A client of the round's store, connected in a helper thread so that a
    newer round does not wait for the connect timeout of a store that is gone."""
    result: dict[str, Any] = {}
    done = threading.Event()

    def connect() -> None:
        try:
            result["store"] = dist.TCPStore(round_.master_addr, round_.master_port, is_master=False,
                                            wait_for_workers=False, timeout=timedelta(seconds=options.store_timeout))
        except Exception as error:  # reported to the waiting thread below
            result["error"] = error
        finally:
            done.set()

    threading.Thread(target=connect, name="elastic-store-connect", daemon=True).start()
    while not done.wait(_MAX_POLL):
        if mailbox.pending is not None:
            raise Superseded(f"round {round_.round}: a newer round arrived while connecting its store", round_.round)
    if "error" in result:
        error = result["error"]
        raise CollectiveFailed(f"round {round_.round}: its store {round_.master_addr}:{round_.master_port} "
                               f"cannot be reached: {str(error).strip().splitlines()[0] if str(error).strip() else error!r}",
                               round_.round) from error
    return result["store"]


def _barrier(store: Any, round_: Round, options: LiveOptions, mailbox: RoundMailbox, deadline: float,
             clock: Callable[[], float], moved: Callable[[], bool] = lambda: False) -> None:
    """Meet the round's other ranks in ``store``; returns once every rank committed to it.

    Raises:
        _GenerationMoved: the round's generation moved past this one before it formed.
        Superseded, CollectiveFailed, NoRoundError: as :func:`form_group`.
    """
    try:
        arrived = store.add(ARRIVED, 1)
        delay = 0.001
        while True:
            if arrived >= round_.world_size:
                verdict = store.compare_set(VERDICT, "", GO)
            elif mailbox.pending is not None:
                verdict = store.compare_set(VERDICT, "", ABANDON)
            elif moved():
                verdict = store.compare_set(VERDICT, "", ABANDON)  # go if every rank arrived first
            elif store.check([VERDICT]):
                verdict = store.get(VERDICT)
            elif clock() >= deadline:
                verdict = store.compare_set(VERDICT, "", ABANDON)
                if verdict == ABANDON:
                    raise NoRoundError(f"round {round_.round} did not form within {options.form_timeout:g}s: "
                                       f"{arrived} of {round_.world_size} ranks arrived")
            else:
                mailbox.wait(delay)
                delay = min(delay * 2, _MAX_POLL)
                arrived = store.add(ARRIVED, 0)
                continue
            if verdict == GO:
                return
            if moved():  # abandoned (by this rank or another) for a newer generation
                raise _GenerationMoved()
            raise Superseded(f"round {round_.round} was abandoned for a newer round before it formed", round_.round)
    except RuntimeError as error:  # torch's DistError family: the store went away
        raise CollectiveFailed(f"round {round_.round}: its store failed during the barrier: {error}", round_.round) from error


def leave_group(formed: FormedGroup, graveyard: Graveyard, reason: str) -> int:
    """Leave ``formed``: fail its collectives in flight, destroy it, keep its hung works in
    ``graveyard``; the number of works left running."""
    hung = formed.registry.close(reason)
    if hung and formed.backend == "nccl":  # NCCL can abort in-flight kernels; gloo cannot (its timeout ends them)
        dist.distributed_c10d._abort_process_group(formed.group)
    if dist.is_initialized():
        dist.destroy_process_group()
    graveyard.bury(formed.group, hung)  # keeps the group referenced while its works run
    return len(hung)
