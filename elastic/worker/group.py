"""Form the default process group of one round from its store, and leave it.

Forming is interruptible up to the moment every rank has committed to the round: the store is
connected in a helper thread, and the ranks meet at a barrier on the round's store whose
outcome is one compare-and-set (``verdict``: ``go`` once all arrived, ``abandon`` when a rank
saw a newer round first), so either every rank of the round calls ``init_process_group`` or
none does, and no rank waits in C++ for a peer that went to a newer round.
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


def pick_backend(options: LiveOptions) -> str:
    if options.backend is not None:
        return options.backend
    return "nccl" if torch.cuda.is_available() else "gloo"


def form_group(round_: Round, options: LiveOptions, mailbox: RoundMailbox, label: str,
               clock: Callable[[], float] = time.monotonic, fenced: bool = True) -> FormedGroup:
    """Form the default process group of ``round_``; ``fenced``: judge completions after a stall
    (:mod:`elastic.worker.fence`; only with an agent that publishes to ``mailbox``).

    Raises:
        Superseded: a newer round arrived before every rank committed to this one.
        CollectiveFailed: the round's store or a peer failed while forming.
        NoRoundError: not every rank arrived within the form timeout.
    """
    deadline = clock() + options.form_timeout
    store = _connect(round_, options, mailbox, clock)
    _barrier(store, round_, options, mailbox, deadline, clock)
    backend = pick_backend(options)
    try:
        dist.init_process_group(backend, store=store, rank=round_.rank, world_size=round_.world_size,
                                timeout=timedelta(seconds=options.collective_timeout))
    except RuntimeError as error:
        raise CollectiveFailed(f"round {round_.round}: init_process_group failed: {error}", round_.round) from error
    fence = CommitFence(mailbox, options.interrupt_grace, options.collective_timeout, label, clock) if fenced else None
    return FormedGroup(round_, dist.group.WORLD, OpRegistry(round_.round, label, clock, fence), backend)


def _connect(round_: Round, options: LiveOptions, mailbox: RoundMailbox, clock: Callable[[], float]) -> Any:
    """A client of the round's store under its prefix, connected in a helper thread so that a
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
    return dist.PrefixStore(round_.store_prefix, result["store"])


def _barrier(store: Any, round_: Round, options: LiveOptions, mailbox: RoundMailbox, deadline: float,
             clock: Callable[[], float]) -> None:
    try:
        arrived = store.add(ARRIVED, 1)
        delay = 0.001
        while True:
            if arrived >= round_.world_size:
                verdict = store.compare_set(VERDICT, "", GO)
            elif mailbox.pending is not None:
                verdict = store.compare_set(VERDICT, "", ABANDON)
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
