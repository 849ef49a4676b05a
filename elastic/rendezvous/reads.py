"""Reads of one run's rendezvous keys, turned into the values the protocol decides on.

Every function reads (or decodes what was read) and returns an immutable value; none writes.
Corrupt records raise :class:`~elastic.rendezvous.errors.RendezvousStateError` naming the key.
"""

from __future__ import annotations

from backends.api import EventType, KeyValue, KVBackend, RangeResult, WatchEvent
from elastic.rendezvous import records
from elastic.rendezvous.attempt import ClosedRound, OwnedJob, StateView
from elastic.rendezvous.decisions import Joiner
from elastic.rendezvous.errors import JobFinishedError, RendezvousClosedError
from elastic.rendezvous.job import FinishedRecord, decode_finished, decode_job
from elastic.rendezvous.records import RendezvousKeys, RoundRecord

__all__ = ["closed_round_from", "finished_error", "joiner_of", "read_alive", "read_joiners", "read_state", "state_from"]


def read_state(backend: KVBackend, keys: RendezvousKeys) -> StateView:
    """``state/`` at one revision."""
    return state_from(keys, backend.get_prefix(keys.state_prefix))


def state_from(keys: RendezvousKeys, read: RangeResult) -> StateView:
    """The state view of a read of ``state/``."""
    found = {kv.key: kv for kv in read.kvs if kv.key in (keys.round, keys.closed, keys.finished, keys.job)}
    round_kv, closed_kv = found.get(keys.round), found.get(keys.closed)
    finished_kv, job_kv = found.get(keys.finished), found.get(keys.job)
    reason = records.decode_closed(closed_kv.key, closed_kv.value).reason if closed_kv is not None else None
    last = None
    if round_kv is not None:
        last = ClosedRound(records.decode_round(round_kv.key, round_kv.value), round_kv.mod_revision)
    finished = decode_finished(finished_kv.key, finished_kv.value) if finished_kv is not None else None
    job = OwnedJob(decode_job(job_kv.key, job_kv.value), job_kv.create_revision) if job_kv is not None else None
    return StateView(read.revision, last, reason, finished, job)


def finished_error(run_id: str, node_id: str, finished: FinishedRecord, joined: bool = True) -> JobFinishedError:
    """The error for a node that meets the job's end (``finished``) while joining; ``joined``:
    it had joined a round of the job before (False: it arrived after the end)."""
    after = f"node {node_id} joins no new round" if joined else f"node {node_id} arrived after it and joined no round"
    return JobFinishedError(f"Rendezvous {run_id}: the job finished on node {finished.node_id} in round "
                            f"{finished.round}; {after}", finished.node_id, finished.round, joined=joined)


def joiner_of(kv: KeyValue) -> Joiner:
    """The joiner whose join record (or closer claim, which holds the same record) is ``kv``."""
    record = records.decode_join(kv.key, kv.value)
    return Joiner(record.node_id, record.addr, record.master_port, kv.create_revision, record.local_world_size,
                  record.role, record.failed_round, record.failed_at)


def read_joiners(backend: KVBackend, keys: RendezvousKeys, forming: int) -> tuple[dict[str, Joiner], int]:
    """The joiners of round ``forming`` by node id, and the revision they were read at."""
    read = backend.get_prefix(keys.nodes_prefix(forming))
    return {joiner.node_id: joiner for joiner in (joiner_of(kv) for kv in read.kvs)}, read.revision


def read_alive(backend: KVBackend, keys: RendezvousKeys, previous: RoundRecord | None) -> set[str]:
    """The previous round's nodes whose join keys of that round still exist (alive and not
    rejoined yet): for the spare rule and the early close (:mod:`elastic.rendezvous.decisions`)."""
    if previous is None:
        return set()
    prefix = keys.nodes_prefix(previous.round)
    return {kv.key[len(prefix):] for kv in backend.get_prefix(prefix).kvs}


def closed_round_from(keys: RendezvousKeys, run_id: str, event: WatchEvent, forming: int) -> ClosedRound | None:
    """The round ``event`` closed if it is ``forming`` or later, else None.

    Raises:
        JobFinishedError: the event records the job's end.
        RendezvousClosedError: the event closes the rendezvous for good.
    """
    if event.type is not EventType.PUT:
        return None
    if event.kv.key == keys.finished:
        finished = decode_finished(event.kv.key, event.kv.value)
        raise JobFinishedError(f"The job of rendezvous {run_id} finished on node {finished.node_id} in round "
                               f"{finished.round} while joining", finished.node_id, finished.round)
    if event.kv.key == keys.closed:
        raise RendezvousClosedError(f"The rendezvous {run_id} was closed while joining",
                                    records.decode_closed(event.kv.key, event.kv.value).reason)
    if event.kv.key == keys.round:
        record = records.decode_round(event.kv.key, event.kv.value)
        if record.round >= forming:
            return ClosedRound(record, event.revision)
    return None
