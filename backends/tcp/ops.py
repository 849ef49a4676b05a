"""Applies one decoded key-value request to a :class:`~backends.kvstate.KVState`; no I/O.

The server hands every request except watches to :func:`apply_request` and gets back the
response header, the values to send after it, and the watch events to fan out. Requests come
from the network, so every field is type-checked: a malformed one raises ProtocolError,
which the server answers with an error frame (the connection stays usable).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

from backends.api import WatchEvent, WriteResult
from backends.errors import LimitExceededError, ProtocolError
from backends.kvstate import KVState
from backends.tcp.protocol import DEFAULT_MAX_FRAME_BYTES, error_to_wire, kv_to_wire
from backends.tcp.txnwire import decode_txn, encode_result
from backends.txn import Put, Range, Txn

__all__ = ["LEASE_OPS", "Reply", "apply_request"]


class Reply(NamedTuple):
    """A response header (a fresh dict, without the request id), its values, and the events produced."""

    header: dict[str, Any]
    parts: Sequence[bytes] = ()
    events: tuple[WatchEvent, ...] = ()


LEASE_OPS = frozenset({"grant", "keepalive", "revoke"})
"""Ops after which the server must reschedule its lease-expiry timer."""

TXN_REPLY_BYTES = DEFAULT_MAX_FRAME_BYTES // 2
"""Most bytes of keys and values one txn reply carries (many reads of the same keys add up)."""

TXN_REPLY_KEYS = TXN_REPLY_BYTES // 64
"""Most keys one txn's ranges may return (each costs the reply at least 64 bytes): a request
whose ranges could return more is refused before it runs."""


def apply_request(state: KVState, op: str, header: dict[str, Any], payload: bytes) -> Reply:
    """Apply request ``op`` and describe the response.

    Raises:
        ProtocolError: unknown op or a malformed field.
        BackendError, ValueError: what the KVState raised (the server sends them back).
    """
    handler = _HANDLERS.get(op)
    if handler is None:
        raise ProtocolError(f"Unknown request {op!r}; the client may be newer than this store.")
    return handler(state, header, payload)


def field(header: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    """``header[name]`` checked to be a ``kind`` (bools are not ints here).

    Raises:
        ProtocolError: the field is missing (without default) or of the wrong type.
    """
    value = header.get(name, default)
    if type(value) is kind:  # the common case, checked first: this runs for every request
        return value
    if value is ...:
        raise ProtocolError(f"The request lacks field {name!r}.")
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ProtocolError(f"The request field {name!r} must be {expected}, not {type(value).__name__}.")
    return value


def _write_reply(result: WriteResult, events: tuple[WatchEvent, ...]) -> Reply:
    parts: list[bytes] = []
    current = None if result.current is None else kv_to_wire(result.current, parts)
    return Reply({"a": result.applied, "r": result.revision, "kv": current}, parts, events)


def _get(state: KVState, header: dict[str, Any], payload: bytes) -> Reply:
    read = state.get(field(header, "k", str))
    parts: list[bytes] = []
    return Reply({"r": read.revision, "kv": None if read.kv is None else kv_to_wire(read.kv, parts)}, parts)


def _range(state: KVState, header: dict[str, Any], payload: bytes) -> Reply:
    result = state.get_prefix(field(header, "p", str))
    parts: list[bytes] = []
    return Reply({"r": result.revision, "kvs": [kv_to_wire(kv, parts) for kv in result.kvs]}, parts)


def _put(state: KVState, header: dict[str, Any], payload: bytes) -> Reply:
    outcome = state.put(field(header, "k", str), payload, field(header, "l", int, 0))
    return Reply({"r": outcome.result.revision}, (), outcome.events)


def _txn(state: KVState, header: dict[str, Any], payload: bytes) -> Reply:
    txn = decode_txn(header.get("t"), payload)
    if _most_keys_read(state, txn) > TXN_REPLY_KEYS:
        raise LimitExceededError(f"The transaction's ranges could return more than {TXN_REPLY_KEYS} keys, more "
                                 "than one reply carries; nothing was run. Read less in one transaction "
                                 "(split it, or use count_only ranges).")
    outcome = state.txn(txn)
    parts: list[bytes] = []
    try:
        return Reply(encode_result(outcome.result, parts, TXN_REPLY_BYTES), parts, outcome.events)
    except LimitExceededError as error:  # the writes applied: say so, and still tell the watchers
        applied = f" Its writes applied at revision {outcome.result.revision}." if outcome.events else ""
        return Reply(error_to_wire(LimitExceededError(f"{error}{applied}")), (), outcome.events)


def _most_keys_read(state: KVState, txn: Txn) -> int:
    """An upper bound on the keys ``txn``'s ranges return, whichever branches run: what each
    range matches now, plus every put of the transaction (a range sees earlier writes)."""
    ranges: list[Range] = []
    puts = 0
    pending = [txn]
    while pending:
        current = pending.pop()
        for op in current.on_success + current.on_failure:
            if isinstance(op, Range) and not op.count_only:
                ranges.append(op)
            elif isinstance(op, Put):
                puts += 1
            elif isinstance(op, Txn):
                pending.append(op)
    return sum((state.count_prefix(op.key) if op.prefix else 1) + puts for op in ranges)


def _delete(state: KVState, header: dict[str, Any], payload: bytes) -> Reply:
    outcome = state.delete(field(header, "k", str))
    return _write_reply(outcome.result, outcome.events)


def _delete_prefix(state: KVState, header: dict[str, Any], payload: bytes) -> Reply:
    outcome = state.delete_prefix(field(header, "p", str))
    return Reply({"n": outcome.result, "r": state.revision}, (), outcome.events)


def _grant(state: KVState, header: dict[str, Any], payload: bytes) -> Reply:
    lease = state.grant(field(header, "ttl", (int, float)))
    return Reply({"lease": lease.id, "ttl": lease.ttl})


def _keepalive(state: KVState, header: dict[str, Any], payload: bytes) -> Reply:
    return Reply({"ttl": state.keepalive(field(header, "lease", int))})


def _revoke(state: KVState, header: dict[str, Any], payload: bytes) -> Reply:
    outcome = state.revoke(field(header, "lease", int))
    return Reply({"a": outcome.result}, (), outcome.events)


def _compact(state: KVState, header: dict[str, Any], payload: bytes) -> Reply:
    state.compact(field(header, "r", int))
    return Reply({"crev": state.compact_revision})


_HANDLERS: dict[str, Callable[[KVState, dict[str, Any], bytes], Reply]] = {
    "get": _get,
    "range": _range,
    "put": _put,
    "txn": _txn,
    "del": _delete,
    "del_prefix": _delete_prefix,
    "grant": _grant,
    "keepalive": _keepalive,
    "revoke": _revoke,
    "compact": _compact,
}
