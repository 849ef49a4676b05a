"""A transaction and its result on the TCP store's wire, both ways, with bounded decoding.

Request header ``{"op": "txn", "t": T}``; the payload holds the bytes of every value the
transaction names (value comparisons' operands and puts' values), in the order they appear
(comparisons first, then the success branch, then the failure branch, depth first)::

    T = {"c": [C, ...], "s": [O, ...], "f": [O, ...]}     (absent lists are empty)
    C = [key, "c" | "m" | "v" | "x", "==" | "!=" | "<" | ">", revision or value size]
    O = ["p", key, lease, value size] | ["d", key, prefix] | ["r", key, prefix, count_only] | ["t", T]

The reply is ``{"ok": succeeded, "r": revision, "rs": [R, ...]}``, with the values of its keys
in the payload in order::

    R = ["p", kv] | ["d", deleted] | ["r", count, [kv, ...]] | ["t", succeeded, [R, ...]]

Both sides come from a peer, so decoding checks every field and bounds nesting depth and
operation counts as it goes (the limits of :mod:`backends.txn`); anything malformed raises
ProtocolError with one line saying what. Encoding a reply stops with LimitExceededError when
its values outgrow the reply budget, so one request cannot make the store build an unbounded
answer from many reads of the same keys.
"""

from __future__ import annotations

from typing import Any

from backends.api import RangeResult
from backends.errors import LimitExceededError, ProtocolError
from backends.tcp.protocol import PayloadReader, kv_to_wire
from backends.txn import (
    MAX_TXN_DEPTH,
    MAX_TXN_OPS,
    MAX_TXN_TOTAL_OPS,
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

__all__ = ["decode_result", "decode_txn", "encode_result", "encode_txn"]

_TARGETS = {Target.CREATE_REVISION: "c", Target.MOD_REVISION: "m", Target.VERSION: "v", Target.VALUE: "x"}
_TARGET_CODES = {code: target for target, code in _TARGETS.items()}
_OPS = {op.value: op for op in CompareOp}


# -- requests --------------------------------------------------------------------------------
def encode_txn(txn: Txn, parts: list[bytes]) -> dict[str, Any]:
    """The header form of ``txn``; appends the values it names to ``parts``, in wire order."""
    compares = []
    for compare in txn.compares:
        operand = compare.operand
        if isinstance(operand, bytes):
            parts.append(operand)
            operand = len(operand)
        compares.append([compare.key, _TARGETS[compare.target], compare.op.value, operand])
    return {"c": compares, "s": _encode_ops(txn.on_success, parts), "f": _encode_ops(txn.on_failure, parts)}


def _encode_ops(branch: tuple[Operation, ...], parts: list[bytes]) -> list[Any]:
    wire: list[Any] = []
    for op in branch:
        if isinstance(op, Put):
            parts.append(bytes(op.value))
            wire.append(["p", op.key, op.lease, len(op.value)])
        elif isinstance(op, Delete):
            wire.append(["d", op.key, op.prefix])
        elif isinstance(op, Range):
            wire.append(["r", op.key, op.prefix, op.count_only])
        else:
            wire.append(["t", encode_txn(op, parts)])
    return wire


class _Budget:
    """Counts operations and comparisons decoded so far against :data:`MAX_TXN_TOTAL_OPS`."""

    def __init__(self) -> None:
        self.used = 0

    def take(self, count: int) -> None:
        self.used += count
        if self.used > MAX_TXN_TOTAL_OPS:
            raise ProtocolError(f"A transaction has more than {MAX_TXN_TOTAL_OPS} operations and comparisons.")


def decode_txn(item: Any, payload: bytes) -> Txn:
    """The :class:`Txn` a request's ``"t"`` field and payload describe.

    Raises:
        ProtocolError: a field is malformed, nesting or counts exceed the limits, or the values
            do not add up to exactly the payload.
    """
    reader = _Bytes(payload)
    txn = _decode_txn(item, reader, 1, _Budget())
    if reader.offset != len(payload):
        raise ProtocolError(f"A transaction names {reader.offset} bytes of values but carries {len(payload)}.")
    return txn


def _decode_txn(item: Any, reader: "_Bytes", depth: int, budget: _Budget) -> Txn:
    if depth > MAX_TXN_DEPTH:
        raise ProtocolError(f"A transaction is nested more than {MAX_TXN_DEPTH} deep.")
    if type(item) is not dict:
        raise ProtocolError(f"A transaction must be an object, not {type(item).__name__}.")
    compares = tuple(_decode_compare(entry, reader) for entry in _list(item, "c", budget))
    success = tuple(_decode_op(entry, reader, depth, budget) for entry in _list(item, "s", budget))
    failure = tuple(_decode_op(entry, reader, depth, budget) for entry in _list(item, "f", budget))
    return Txn(compares, success, failure)


def _list(item: dict[str, Any], name: str, budget: _Budget) -> list[Any]:
    entries = item.get(name, [])
    if type(entries) is not list:
        raise ProtocolError(f"A transaction's {name!r} must be a list, not {type(entries).__name__}.")
    if len(entries) > MAX_TXN_OPS:
        raise ProtocolError(f"A transaction's {name!r} has {len(entries)} entries; at most {MAX_TXN_OPS} are accepted.")
    budget.take(len(entries))
    return entries


def _decode_compare(entry: Any, reader: "_Bytes") -> Compare:
    if not (type(entry) is list and len(entry) == 4 and type(entry[0]) is str
            and entry[1] in _TARGET_CODES and entry[2] in _OPS and _is_size(entry[3])):
        raise ProtocolError(f"A comparison must be [key, target, operator, non-negative integer], not {entry!r:.80}.")
    target = _TARGET_CODES[entry[1]]
    operand = reader.take(entry[3]) if target is Target.VALUE else entry[3]
    return Compare(entry[0], target, _OPS[entry[2]], operand)


def _decode_op(entry: Any, reader: "_Bytes", depth: int, budget: _Budget) -> Operation:
    kind = entry[0] if type(entry) is list and entry else None
    if kind == "p" and len(entry) == 4 and type(entry[1]) is str and _is_size(entry[2]) and _is_size(entry[3]):
        return Put(entry[1], reader.take(entry[3]), entry[2])
    if kind == "d" and len(entry) == 3 and type(entry[1]) is str and type(entry[2]) is bool:
        return Delete(entry[1], entry[2])
    if kind == "r" and len(entry) == 4 and type(entry[1]) is str and type(entry[2]) is bool and type(entry[3]) is bool:
        return Range(entry[1], entry[2], entry[3])
    if kind == "t" and len(entry) == 2:
        return _decode_txn(entry[1], reader, depth + 1, budget)
    raise ProtocolError(f"A transaction operation must be a put, delete, range or txn entry, not {entry!r:.80}.")


def _is_size(value: Any) -> bool:
    return type(value) is int and value >= 0


class _Bytes:
    """Hands out consecutive slices of a payload."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.offset = 0

    def take(self, size: int) -> bytes:
        end = self.offset + size
        if end > len(self.payload):
            raise ProtocolError(f"A transaction names more value bytes than its {len(self.payload)}-byte payload.")
        value = self.payload[self.offset : end]
        self.offset = end
        return value


# -- results ---------------------------------------------------------------------------------
def encode_result(result: TxnResult, parts: list[bytes], max_bytes: int) -> dict[str, Any]:
    """The reply header of ``result``; appends its values to ``parts``.

    Raises:
        LimitExceededError: the reply's keys and values come to more than ``max_bytes``.
    """
    budget = [max_bytes]
    return {"ok": result.succeeded, "r": result.revision, "rs": _encode_responses(result.responses, parts, budget)}


def _encode_responses(responses: tuple[Response, ...], parts: list[bytes], budget: list[int]) -> list[Any]:
    wire: list[Any] = []
    for response in responses:
        if isinstance(response, PutResult):
            _spend(budget, response.kv.key, response.kv.value)
            wire.append(["p", kv_to_wire(response.kv, parts)])
        elif isinstance(response, DeleteResult):
            wire.append(["d", response.deleted])
        elif isinstance(response, RangeResult):
            kvs = []
            for kv in response.kvs:
                _spend(budget, kv.key, kv.value)
                kvs.append(kv_to_wire(kv, parts))
            wire.append(["r", response.count, kvs])
        else:
            wire.append(["t", response.succeeded, _encode_responses(response.responses, parts, budget)])
    return wire


def _spend(budget: list[int], key: str, value: bytes) -> None:
    budget[0] -= len(value) + 4 * len(key) + 64
    if budget[0] < 0:
        raise LimitExceededError("The transaction reads more than one reply can carry; read less in one "
                                 "transaction (split it, or use count_only ranges).")


def decode_result(header: dict[str, Any], payload: bytes) -> TxnResult:
    """The :class:`TxnResult` of a txn reply.

    Raises:
        ProtocolError: the reply is malformed or nested too deeply.
    """
    revision = header.get("r")
    if type(header.get("ok")) is not bool or not _is_size(revision):
        raise ProtocolError("The elastic-store's txn reply lacks its outcome or revision.")
    reader = PayloadReader(payload)
    return TxnResult(header["ok"], revision, _decode_responses(header.get("rs"), reader, revision, 1))


def _decode_responses(items: Any, reader: PayloadReader, revision: int, depth: int) -> tuple[Response, ...]:
    if depth > MAX_TXN_DEPTH or type(items) is not list or len(items) > MAX_TXN_OPS:
        raise ProtocolError(f"The elastic-store's txn reply has a malformed response list ({items!r:.80}).")
    responses: list[Response] = []
    for item in items:
        kind = item[0] if type(item) is list and item else None
        if kind == "p" and len(item) == 2:
            responses.append(PutResult(reader.kv(item[1])))
        elif kind == "d" and len(item) == 2 and _is_size(item[1]):
            responses.append(DeleteResult(item[1]))
        elif kind == "r" and len(item) == 3 and _is_size(item[1]) and type(item[2]) is list:
            responses.append(RangeResult(revision, tuple(reader.kv(entry) for entry in item[2]), item[1]))
        elif kind == "t" and len(item) == 3 and type(item[1]) is bool:
            responses.append(TxnResult(item[1], revision, _decode_responses(item[2], reader, revision, depth + 1)))
        else:
            raise ProtocolError(f"The elastic-store's txn reply has a malformed response {item!r:.80}.")
    return tuple(responses)
