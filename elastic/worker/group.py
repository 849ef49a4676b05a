"""Form the default process group of one round from its store, and leave it.

Forming is interruptible up to the moment the group's members are decided: the store is
connected in a tracked helper thread (:mod:`elastic.worker.leftover`), and the ranks meet at a
barrier on the round's store whose outcome is one compare-and-set (the verdict,
:mod:`elastic.worker.formation`): ``go`` with the members, or ``abandon`` when a rank saw a newer round first. Each arriving rank appends its
arrival (its round rank, whether it holds the newest training state); the verdict is decided
by :func:`elastic.worker.decisions.decide_close`: every rank there, or, once a rank holding
the newest state has been there for the regroup window, the ranks present. So survivors do
not wait for a replacement that is still starting. Exactly the members call
``init_process_group``, with their index in the members as their rank and the members' number
as the world size; no rank waits in C++ for a peer that went elsewhere.

Within a round the ranks form one *generation* at a time (:mod:`elastic.worker.refill`): the
caller says which (join the current one, or move past one). A rank that arrives after its
generation formed without it moves the round to the next generation (a regroup) and forms that
one, with the members who come at their next step boundary. A barrier abandons its generation
as soon as the round's generation key moves past it, for the newest.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from elastic.worker.channel import RoundMailbox
from elastic.worker.decisions import CloseAction, CloseView, decide_close
from elastic.worker.errors import CollectiveFailed, NoRoundError, Superseded
from elastic.worker.fence import CommitFence
from elastic.worker.formation import (
    ABANDON,
    ARRIVALS,
    ARRIVED,
    VERDICT,
    ArrivalRecord,
    Verdict,
    encode_arrival,
    encode_verdict,
    parse_arrivals,
    parse_verdict,
)
from elastic.worker.guard import Graveyard, OpRegistry
from elastic.worker.leftover import start_call
from elastic.worker.options import LiveOptions
from elastic.worker.refill import (
    GenerationState,
    GenerationStore,
    Move,
    generation_key,
    generation_prefix,
    move_generation,
    read_generation,
)
from elastic.worker.rounds import Round

log = logging.getLogger(__name__)

__all__ = ["FormedGroup", "form_group", "leave_group", "pick_backend"]

_MAX_POLL = 0.02


@dataclass
class FormedGroup:
    """The group of one round, in use, and the registry of its collectives.

    ``members`` are the round ranks that formed it, ascending; this rank's rank in the group is
    its index there (:attr:`rank`), the group's size their number (:attr:`world_size`).
    ``store`` is the round's store (under its prefix), whose generation key a member watches.
    """

    round: Round
    group: dist.ProcessGroup
    registry: OpRegistry
    backend: str
    generation: int = 0
    members: tuple[int, ...] = ()
    store: Any = None

    @property
    def rank(self) -> int:
        """This rank in the group (the round's rank when every rank of the round formed it)."""
        return self.members.index(self.round.rank) if self.members else self.round.rank

    @property
    def world_size(self) -> int:
        return len(self.members) if self.members else self.round.world_size


def pick_backend(options: LiveOptions) -> str:
    if options.backend is not None:
        return options.backend
    return "nccl" if torch.cuda.is_available() else "gloo"


def form_group(round_: Round, options: LiveOptions, mailbox: RoundMailbox, label: str,
               clock: Callable[[], float] = time.monotonic, fenced: bool = True,
               pick: Callable[[GenerationStore], GenerationState] = read_generation,
               wait_until: float | None = None, arrival: ArrivalRecord | None = None,
               on_left_out: Callable[[], None] = lambda: None) -> FormedGroup:
    """Form the default process group of ``round_``; ``fenced``: judge completions after a stall
    (:mod:`elastic.worker.fence`; only with an agent that publishes to ``mailbox``); ``pick``:
    the generation to form, given the round's store (default: the current one); ``wait_until``:
    give up on the barrier then, if before the form timeout; ``arrival``: what this rank tells
    the others (default: its rank, holding nothing); ``on_left_out``: called when a generation
    formed without this rank (it then arrives at the next one holding nothing).

    Raises:
        Superseded: a newer round arrived before this rank was in a group of this one, or a
            peer left this round for a newer one.
        CollectiveFailed: the round's store or a peer failed while forming, or the store holds garbage.
        NoRoundError: the generation could not close within the form timeout.
    """
    deadline = clock() + options.form_timeout
    if wait_until is not None:
        deadline = min(deadline, wait_until)
    me = arrival or ArrivalRecord(round_.rank, False)
    client = _connect(round_, options, mailbox, clock)
    base = dist.PrefixStore(round_.store_prefix, client)
    state = _read(round_, lambda: pick(base))
    while True:
        if state.left_for is not None:
            raise Superseded(f"round {round_.round} was left for round {state.left_for} by a peer; waiting for it",
                             round_.round)
        store = dist.PrefixStore(generation_prefix(round_.store_prefix, state.number), client)
        moved = _Moved(round_, base, state)
        try:
            expected = _read(round_, lambda: _expected(base, state, round_.world_size))
            members = _barrier(store, round_, options, mailbox, deadline, clock, moved, me, expected)
            break
        except _GenerationMoved:
            state = moved.newest
        except _LeftOut as out:
            log.info("%s: round %d generation %d formed without this rank (members %s); joining at the next "
                     "generation", label, round_.round, state.number, list(out.members))
            on_left_out()
            me = ArrivalRecord(me.rank, False, me.step, me.round)
            past = state.number
            state = _read(round_, lambda: move_generation(base, past, Move.REGROUP))
    backend = pick_backend(options)
    try:
        dist.init_process_group(backend, store=store, rank=members.index(round_.rank), world_size=len(members),
                                timeout=timedelta(seconds=options.collective_timeout))
    except RuntimeError as error:
        raise CollectiveFailed(f"round {round_.round}: init_process_group failed: {error}", round_.round) from error
    fence = CommitFence(mailbox, options.interrupt_grace, options.collective_timeout, label, clock) if fenced else None
    return FormedGroup(round_, dist.group.WORLD, OpRegistry(round_.round, label, clock, fence), backend, state.number,
                       members, base)


class _GenerationMoved(Exception):
    """The generation being formed was abandoned for a newer one (internal to form_group)."""


class _LeftOut(Exception):
    """The generation formed without this rank (internal to form_group)."""

    def __init__(self, members: tuple[int, ...]) -> None:
        super().__init__(members)
        self.members = members


class _Moved:
    """Whether the round's generation moved past ``state`` or the round was left (remembering the newest seen)."""

    def __init__(self, round_: Round, base: Any, state: GenerationState) -> None:
        self._round, self._base, self.generation, self.newest = round_, base, state.number, state

    def __call__(self) -> bool:
        self.newest = _read(self._round, lambda: read_generation(self._base))
        return self.newest.number > self.generation or self.newest.left_for is not None


def _expected(base: Any, state: GenerationState, world_size: int) -> frozenset[int] | None:
    """The members of the generation a regroup replaces (who the regroup waits for); None otherwise.

    Raises:
        ValueError: that generation has no go verdict (a regroup follows only a formed one).
    """
    if state.move is not Move.REGROUP or state.number == 0:
        return None
    key = generation_key(state.number - 1, VERDICT)
    verdict = parse_verdict(base.get(key), world_size) if base.check([key]) else ABANDON
    if not verdict.go:
        raise ValueError(f"generation {state.number} is a regroup of generation {state.number - 1}, which did not form")
    return frozenset(verdict.members)


def _read(round_: Round, read: Callable[[], Any]) -> Any:
    try:
        return read()
    except RuntimeError as error:  # torch's DistError family: the store went away
        raise CollectiveFailed(f"round {round_.round}: its store failed: {error}", round_.round) from error
    except ValueError as error:
        raise CollectiveFailed(f"round {round_.round}: {error}", round_.round) from error


def _connect(round_: Round, options: LiveOptions, mailbox: RoundMailbox, clock: Callable[[], float]) -> Any:
    """A client of the round's store, connected in a tracked helper thread
    (:func:`elastic.worker.leftover.start_call`) so that a newer round does not wait for the
    connect timeout of a store that is gone; a connect left behind is waited for at close."""
    call = start_call(lambda: dist.TCPStore(round_.master_addr, round_.master_port, is_master=False,
                                            wait_for_workers=False, timeout=timedelta(seconds=options.store_timeout)),
                      name="elastic-store-connect")
    while not call.wait(_MAX_POLL):
        if mailbox.pending is not None:
            raise Superseded(f"round {round_.round}: a newer round arrived while connecting its store", round_.round)
    if call.error is not None:
        error = call.error
        raise CollectiveFailed(f"round {round_.round}: its store {round_.master_addr}:{round_.master_port} "
                               f"cannot be reached: {str(error).strip().splitlines()[0] if str(error).strip() else error!r}",
                               round_.round) from error
    return call.value


def _barrier(store: Any, round_: Round, options: LiveOptions, mailbox: RoundMailbox, deadline: float,
             clock: Callable[[], float], moved: Callable[[], bool] = lambda: False,
             arrival: ArrivalRecord | None = None, expected: frozenset[int] | None = None) -> tuple[int, ...]:
    """Meet the round's other ranks in ``store``; the members (round ranks, ascending) once the
    verdict names this rank among them.

    Raises:
        _GenerationMoved: the round's generation moved past this one before it formed.
        _LeftOut: it formed without this rank.
        Superseded, CollectiveFailed, NoRoundError: as :func:`form_group`.
    """
    me = arrival or ArrivalRecord(round_.rank, False)
    world = round_.world_size
    try:
        store.append(ARRIVALS, encode_arrival(me))
        store.add(ARRIVED, 1)
        seen, arrivals, first_holder, delay = 0, {}, None, 0.001
        while True:
            if store.check([VERDICT]):
                return _outcome(parse_verdict(store.get(VERDICT), world), round_, moved)
            count = store.add(ARRIVED, 0)
            if count != seen:
                arrivals, seen = parse_arrivals(store.get(ARRIVALS), world), count
            holders = frozenset(rank for rank, record in arrivals.items() if record.holder)
            now = clock()
            if holders and first_holder is None:
                first_holder = now
            view = CloseView(world, frozenset(arrivals), holders, expected,
                             window_over=first_holder is not None and now - first_holder >= options.regroup_window,
                             deadline_over=now >= deadline, newer=mailbox.pending is not None or moved(),
                             replica_size=round_.local_world_size if options.hsdp else 1)
            close = decide_close(view)
            if close.action is CloseAction.WAIT:
                mailbox.wait(delay)
                delay = min(delay * 2, _MAX_POLL)
                continue
            desired = Verdict(close.members) if close.action is CloseAction.GO else ABANDON
            verdict = parse_verdict(store.compare_set(VERDICT, "", encode_verdict(desired).decode()), world)
            if close.action is CloseAction.TIMEOUT and not verdict.go:
                raise NoRoundError(f"round {round_.round} did not form within {options.form_timeout:g}s: "
                                   f"{len(arrivals)} of {world} ranks arrived"
                                   + ("" if holders else ", none of them holding training state"))
            if verdict == desired and verdict.go and len(verdict.members) < world:
                log.info("round %d: closed a generation with %d of %d ranks (%s); the others join at a later step",
                         round_.round, len(verdict.members), world, list(verdict.members))
            return _outcome(verdict, round_, moved)
    except RuntimeError as error:  # torch's DistError family: the store went away
        raise CollectiveFailed(f"round {round_.round}: its store failed during the barrier: {error}", round_.round) from error
    except ValueError as error:  # a value in the store is garbage
        raise CollectiveFailed(f"round {round_.round}: {error}", round_.round) from error


def _outcome(verdict: Verdict, round_: Round, moved: Callable[[], bool]) -> tuple[int, ...]:
    if verdict.go:
        if round_.rank in verdict.members:
            return verdict.members
        raise _LeftOut(verdict.members)
    if moved():  # abandoned (by this rank or another) for a newer generation
        raise _GenerationMoved()
    raise Superseded(f"round {round_.round} was abandoned for a newer round before it formed", round_.round)


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
