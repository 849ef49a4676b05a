"""A :class:`~backends.txn.Txn` as etcd's ``TxnRequest`` and a ``TxnResponse`` as a TxnResult, one to one.

Pure: no I/O. Puts ask for ``prev_kv`` so each :class:`~backends.txn.PutResult` holds the key
as written (its create revision and version continue the previous incarnation's, if any);
a Range's count is etcd's ``count``. Nested transactions become ``request_txn`` (etcd >= 3.3).
"""

from __future__ import annotations

from typing import Any

from etcd3 import etcdrpc

from backends.api import KeyValue, RangeResult
from backends.errors import ProtocolError
from backends.etcd.convert import encode_key, key_value, prefix_range_end
from backends.txn import (
    Compare,
    CompareOp,
    Delete,
    DeleteResult,
    Operation,
    Put,
    PutResult,
    Range,
    Response,
    Target,
    Txn,
    TxnResult,
)

__all__ = ["txn_request", "txn_result"]

_TARGETS = {
    Target.CREATE_REVISION: (etcdrpc.Compare.CREATE, "create_revision"),
    Target.MOD_REVISION: (etcdrpc.Compare.MOD, "mod_revision"),
    Target.VERSION: (etcdrpc.Compare.VERSION, "version"),
    Target.VALUE: (etcdrpc.Compare.VALUE, "value"),
}
_RESULTS = {
    CompareOp.EQUAL: etcdrpc.Compare.EQUAL,
    CompareOp.NOT_EQUAL: etcdrpc.Compare.NOT_EQUAL,
    CompareOp.LESS: etcdrpc.Compare.LESS,
    CompareOp.GREATER: etcdrpc.Compare.GREATER,
}


def txn_request(txn: Txn) -> Any:
    """The ``etcdserverpb.TxnRequest`` for ``txn`` (already checked with :func:`~backends.txn.check_txn`)."""
    return etcdrpc.TxnRequest(
        compare=[_compare(compare) for compare in txn.compares],
        success=[_request_op(op) for op in txn.on_success],
        failure=[_request_op(op) for op in txn.on_failure],
    )


def _compare(compare: Compare) -> Any:
    target, field = _TARGETS[compare.target]
    return etcdrpc.Compare(key=encode_key(compare.key), target=target, result=_RESULTS[compare.op],
                           **{field: compare.operand})


def _request_op(op: Operation) -> Any:
    if isinstance(op, Put):
        return etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(
            key=encode_key(op.key), value=bytes(op.value), lease=op.lease, prev_kv=True))
    if isinstance(op, Delete):
        return etcdrpc.RequestOp(request_delete_range=etcdrpc.DeleteRangeRequest(**_key_range(op.key, op.prefix)))
    if isinstance(op, Range):
        return etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(
            **_key_range(op.key, op.prefix), count_only=op.count_only))
    return etcdrpc.RequestOp(request_txn=txn_request(op))


def _key_range(key: str, prefix: bool) -> dict[str, bytes]:
    raw = encode_key(key)
    return {"key": raw, "range_end": prefix_range_end(raw)} if prefix else {"key": raw}


def txn_result(txn: Txn, response: Any, revision: int) -> TxnResult:
    """The :class:`TxnResult` of ``txn`` from etcd's ``TxnResponse`` (or a nested one), at ``revision``.

    Raises:
        ProtocolError: the response does not match the branch it says ran.
    """
    branch = txn.on_success if response.succeeded else txn.on_failure
    if len(response.responses) != len(branch):
        raise ProtocolError(f"etcd answered a transaction branch of {len(branch)} operations with "
                            f"{len(response.responses)} responses.")
    responses = tuple(_response(op, item, revision) for op, item in zip(branch, response.responses))
    return TxnResult(bool(response.succeeded), revision, responses)


def _response(op: Operation, item: Any, revision: int) -> Response:
    kind = item.WhichOneof("response")
    if isinstance(op, Put) and kind == "response_put":
        previous = item.response_put.prev_kv
        existed = previous.create_revision > 0
        return PutResult(KeyValue(
            key=op.key,
            value=bytes(op.value),
            create_revision=previous.create_revision if existed else revision,
            mod_revision=revision,
            version=previous.version + 1 if existed else 1,
            lease=op.lease,
        ))
    if isinstance(op, Delete) and kind == "response_delete_range":
        return DeleteResult(int(item.response_delete_range.deleted))
    if isinstance(op, Range) and kind == "response_range":
        ranged = item.response_range
        return RangeResult(revision, tuple(key_value(kv) for kv in ranged.kvs), int(ranged.count))
    if isinstance(op, Txn) and kind == "response_txn":
        return txn_result(op, item.response_txn, revision)
    raise ProtocolError(f"etcd answered a {type(op).__name__} operation with {kind or 'nothing'}.")
