"""The rendezvous's two contended writes, each one transaction over the backend contract.

* **Join** (:func:`join_txn`): put this node's join key for round ``r``; create the round's
  closer claim if it is absent, else read its holder; count the joiners of ``r``; drop this
  node's key of an earlier round. Like etcd's ``concurrency.Mutex.tryAcquire`` it is one
  ``Txn().If(claim absent).Then(put, put claim).Else(put, get claim)``, so every joiner learns
  from its own write whether it closes and how many have joined, without a contended retry.
  Every join is guarded: the rendezvous is open, the job has not finished and (with an
  identity) the job record is the one the node checked; the optimistic first join also guards
  on the round record being the one the node expects and reads ``state/`` in both branches. A
  join whose guard fails writes nothing and returns ``state/`` to decide from.
* **Close** (:func:`close_txn`): write the round record if it is still the one the closer read
  and the job has not finished, and drop the closer claim at the same revision, so each member's ``state/`` watch gets one
  message.
* **Re-read** (:func:`reread_txn`): a member's round, the next round and ``state/`` at one
  revision, after its watch history was compacted (no write).

Building and reading the transactions is pure; the handler sends them.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.api import KeyValue, RangeResult
from backends.errors import ProtocolError
from backends.txn import Compare, Delete, Put, PutResult, Range, Response, Txn, TxnResult
from elastic.rendezvous import records
from elastic.rendezvous.reconcile import RoundSnapshot
from elastic.rendezvous.errors import RendezvousStateError
from elastic.rendezvous.job import decode_finished
from elastic.rendezvous.records import RendezvousKeys

__all__ = [
    "CloseOutcome",
    "JoinOutcome",
    "close_txn",
    "join_txn",
    "read_close",
    "read_join",
    "read_reread",
    "reread_txn",
]


@dataclass(frozen=True)
class JoinOutcome:
    """What a join transaction did.

    Attributes:
        joined: whether the join key was written (False only when a guard failed).
        revision: the store revision after the transaction.
        closer: the claim key after the join (ours if we created it); None when not joined.
        count: the joiners of the round right after the join; 0 when not joined.
        state: ``state/`` read in the same step (guarded joins only).
    """

    joined: bool
    revision: int
    closer: KeyValue | None = None
    count: int = 0
    state: RangeResult | None = None


@dataclass(frozen=True)
class CloseOutcome:
    """What a close did: whether it wrote the round record, at which revision, the round
    record now in the store (ours if it applied; None if the key is absent), and the job's
    finished record when that is what refused the close."""

    applied: bool
    revision: int
    current: KeyValue | None
    finished: KeyValue | None = None


def join_txn(
    keys: RendezvousKeys, forming: int, node_id: str, value: bytes, lease: int,
    previous_key: str | None = None, expected_round: int | None = None, job_created: int | None = None,
) -> Txn:
    """The join of round ``forming`` (see the module docstring), guarded: it writes only while
    the rendezvous is open and the job has not finished, and ``state/`` is read when it does not.

    ``previous_key``: this node's join key of an earlier round, deleted in the same step.
    ``expected_round``: also guard on the round record's mod revision (0: no round record yet);
    ``state/`` is then read in both branches. ``job_created``: also guard on the job identity
    record being the one this node checked (its create revision; :mod:`elastic.rendezvous.job`).
    """
    key, claim = keys.node(forming, node_id), keys.closer(forming)
    count = Range(keys.nodes_prefix(forming), prefix=True, count_only=True)
    drop = (Delete(previous_key),) if previous_key is not None and previous_key != key else ()
    join = Put(key, value, lease)
    inner = Txn(
        (Compare.absent(claim),),
        (join, Put(claim, value, lease), count, *drop),
        (join, Range(claim), count, *drop),
    )
    guards = [Compare.absent(keys.closed), Compare.absent(keys.finished)]
    if expected_round is not None:
        guards.insert(0, Compare.mod_revision(keys.round, expected_round))
    if job_created is not None:
        guards.append(Compare.created_at(keys.job, job_created))
    state = Range(keys.state_prefix, prefix=True)
    return Txn(tuple(guards), (inner, state) if expected_round is not None else (inner,), (state,))


def read_join(result: TxnResult, claim_key: str, guarded: bool) -> JoinOutcome:
    """The outcome of a :func:`join_txn` result (``guarded``: it had an ``expected_round``).

    Raises:
        RendezvousStateError: the store said the claim is held but returned no holder.
        ProtocolError: the result does not have the transaction's shape.
    """
    if not result.succeeded:
        return JoinOutcome(False, result.revision, state=_range(result.responses[-1]))
    state = _range(result.responses[-1]) if guarded else None
    inner = _txn(result.responses[0])
    claim, count = inner.responses[1], _range(inner.responses[2])
    if inner.succeeded:
        closer = _put(claim).kv
    else:
        kvs = _range(claim).kvs
        if not kvs:  # cannot happen: the comparison saw the claim in the same step
            raise RendezvousStateError(f"The store reported the closer claim {claim_key} as held but returned no holder.")
        closer = kvs[0]
    return JoinOutcome(True, result.revision, closer, count.count, state)


def close_txn(keys: RendezvousKeys, forming: int, record: bytes, expected_round: int) -> Txn:
    """Write the round record if its mod revision is still ``expected_round`` (0: absent) and the
    job has not finished, and drop round ``forming``'s closer claim in the same step; else read
    the record and the finished record."""
    return Txn((Compare.mod_revision(keys.round, expected_round), Compare.absent(keys.finished)),
               (Put(keys.round, record), Delete(keys.closer(forming))),
               (Range(keys.round), Range(keys.finished)))


def read_close(result: TxnResult) -> CloseOutcome:
    """The outcome of a :func:`close_txn` result.

    Raises:
        ProtocolError: the result does not have the transaction's shape.
    """
    if result.succeeded:
        return CloseOutcome(True, result.revision, _put(result.responses[0]).kv)
    kvs, finished = _range(result.responses[0]).kvs, _range(result.responses[1]).kvs
    return CloseOutcome(False, result.revision, kvs[0] if kvs else None, finished[0] if finished else None)


def reread_txn(keys: RendezvousKeys, round_number: int) -> Txn:
    """Read round ``round_number``'s keys (joins and done marks), the next round's joins and
    ``state/``, all at one revision."""
    return Txn((), (Range(keys.round_prefix(round_number), prefix=True),
                    Range(keys.nodes_prefix(round_number + 1), prefix=True),
                    Range(keys.state_prefix, prefix=True)))


def read_reread(keys: RendezvousKeys, round_number: int, result: TxnResult) -> RoundSnapshot:
    """The snapshot a :func:`reread_txn` result shows.

    Raises:
        RendezvousStateError: the round, closed or finished record is corrupt.
        ProtocolError: the result does not have the transaction's shape.
    """
    round_keys, waiting, state = (_range(response) for response in result.responses)
    present, done = set(), set()
    for kv in round_keys.kvs:
        if (joined := keys.parse_node_key(kv.key)) is not None and joined[0] == round_number:
            present.add(joined[1])
        elif (marked := keys.parse_done_key(kv.key)) is not None and marked[0] == round_number:
            done.add(marked[1])
    record = closed = finished = None
    for kv in state.kvs:
        if kv.key == keys.round:
            record = records.decode_round(kv.key, kv.value)
        elif kv.key == keys.closed:
            closed = records.decode_closed(kv.key, kv.value)
        elif kv.key == keys.finished:
            finished = decode_finished(kv.key, kv.value)
    prefix = keys.nodes_prefix(round_number + 1)
    return RoundSnapshot(result.revision, record, closed is not None, frozenset(present), frozenset(done),
                         frozenset(kv.key[len(prefix):] for kv in waiting.kvs), finished)


def _range(response: Response) -> RangeResult:
    if not isinstance(response, RangeResult):
        raise ProtocolError(f"The store answered a range with {type(response).__name__}.")
    return response


def _put(response: Response) -> PutResult:
    if not isinstance(response, PutResult):
        raise ProtocolError(f"The store answered a put with {type(response).__name__}.")
    return response


def _txn(response: Response) -> TxnResult:
    if not isinstance(response, TxnResult):
        raise ProtocolError(f"The store answered a nested transaction with {type(response).__name__}.")
    return response
