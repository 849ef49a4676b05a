"""The TCP store's txn wire form: round trips, and one clear ProtocolError for every malformed request."""

import pytest

from backends.api import KeyValue, RangeResult
from backends.errors import LimitExceededError, ProtocolError
from backends.kvstate import KVState
from backends.tcp.ops import apply_request
from backends.tcp.txnwire import decode_result, decode_txn, encode_result, encode_txn
from backends.txn import (
    MAX_TXN_DEPTH,
    Compare,
    CompareOp,
    Delete,
    DeleteResult,
    Put,
    PutResult,
    Range,
    Target,
    Txn,
    TxnResult,
)


def nested(depth: int) -> Txn:
    txn = Txn((), (Range("/k"),))
    for _ in range(depth - 1):
        txn = Txn((), (txn,))
    return txn


def test_a_transaction_with_every_kind_of_part_round_trips():
    txn = Txn(
        (Compare.value_is("/v", b"\x00\xff"), Compare("/n", Target.VERSION, CompareOp.LESS, 3), Compare.absent("/a")),
        (Put("/p", b"one", 7), Delete("/d/", prefix=True), Range("/r/", prefix=True, count_only=True),
         Txn((Compare.mod_revision("/m", 9),), (Put("/q", b""),), (Range("/q"),))),
        (Put("/p", b"two"), Delete("/x")),
    )
    parts: list[bytes] = []
    header = encode_txn(txn, parts)
    assert decode_txn(header, b"".join(parts)) == txn


def test_a_result_round_trips_with_the_outer_revision_everywhere():
    kv = KeyValue("/p", b"v", 5, 7, 2, 0)
    result = TxnResult(True, 7, (PutResult(kv), DeleteResult(2), RangeResult(7, (kv, kv)), RangeResult(7, (), 4),
                                 TxnResult(False, 7, (RangeResult(7, ()),))))
    parts: list[bytes] = []
    header = encode_result(result, parts, 1 << 20)
    assert decode_result(header, b"".join(parts)) == result


def test_a_reply_over_its_budget_is_refused_while_encoding():
    kv = KeyValue("/p", b"v" * 1000, 5, 7, 2, 0)
    with pytest.raises(LimitExceededError, match="read less"):
        encode_result(TxnResult(True, 7, tuple(RangeResult(7, (kv,)) for _ in range(100))), [], 50_000)


@pytest.mark.parametrize(
    "item, payload, reason",
    [
        ("txn", b"", "must be an object"),
        ({"c": "x"}, b"", "must be a list"),
        ({"c": [["/k", "c", "==", -1]]}, b"", "comparison"),
        ({"c": [["/k", "c", "~", 1]]}, b"", "comparison"),
        ({"c": [["/k", "q", "==", 1]]}, b"", "comparison"),
        ({"c": [[1, "c", "==", 1]]}, b"", "comparison"),
        ({"c": [["/k", "m", "==", True]]}, b"", "comparison"),
        ({"c": [["/k", "x", "==", 4]]}, b"ab", "more value bytes"),
        ({"s": [["p", "/k", 0, 5]]}, b"abc", "more value bytes"),
        ({"s": [["p", "/k", 0, 1]]}, b"abc", "carries 3"),
        ({"s": [["p", "/k", -1, 1]]}, b"a", "operation"),
        ({"s": [["d", "/k", 1]]}, b"", "operation"),
        ({"s": [["r", "/k", False]]}, b"", "operation"),
        ({"s": [["z", "/k"]]}, b"", "operation"),
        ({"s": [[]]}, b"", "operation"),
        ({"f": [["t", []]]}, b"", "must be an object"),
        ({"s": [["r", "/k", False, False]] * 129}, b"", "at most 128"),
        ({"s": [["t", {"s": [["r", "/k", False, False]] * 128}]] * 9}, b"", "more than 1024"),
    ],
)
def test_a_malformed_transaction_is_one_protocol_error(item, payload, reason):
    with pytest.raises(ProtocolError, match=reason):
        decode_txn(item, payload)


def test_nesting_beyond_the_limit_is_refused_before_it_is_decoded_further():
    parts: list[bytes] = []
    assert decode_txn(encode_txn(nested(MAX_TXN_DEPTH), parts), b"") == nested(MAX_TXN_DEPTH)
    item: dict = {"s": [["r", "/k", False, False]]}
    for _ in range(500):  # far deeper than the limit: refused at the limit, no recursion error
        item = {"s": [["t", item]]}
    with pytest.raises(ProtocolError, match=f"more than {MAX_TXN_DEPTH} deep"):
        decode_txn(item, b"")


@pytest.mark.parametrize(
    "header",
    [{"r": 1, "rs": []}, {"ok": True, "r": -1, "rs": []}, {"ok": True, "r": 1, "rs": [["p", ["/k"]]]},
     {"ok": True, "r": 1, "rs": [["r", 1, "x"]]}, {"ok": True, "r": 1, "rs": [["t", 1, []]]},
     {"ok": True, "r": 1, "rs": [["d", -2]]}, {"ok": True, "r": 1, "rs": "x"}],
)
def test_a_malformed_reply_is_one_protocol_error(header):
    with pytest.raises(ProtocolError):
        decode_result(header, b"")


def test_the_store_runs_a_decoded_transaction_and_refuses_duplicate_writes_as_invalid():
    state = KVState()
    parts: list[bytes] = []
    header = encode_txn(Txn((Compare.absent("/k"),), (Put("/k", b"v"), Range("/k"))), parts)
    reply = apply_request(state, "txn", {"op": "txn", "t": header}, b"".join(parts))
    assert reply.header["ok"] is True and reply.header["r"] == 2 and len(reply.events) == 1
    twice = encode_txn(Txn((), (Put("/k", b"a"), Put("/k", b"b"))), parts := [])
    with pytest.raises(ValueError, match="twice"):
        apply_request(state, "txn", {"op": "txn", "t": twice}, b"".join(parts))
    assert state.revision == 2


def test_a_txn_whose_ranges_could_outgrow_a_reply_is_refused_before_it_runs(monkeypatch):
    import backends.tcp.ops as ops

    monkeypatch.setattr(ops, "TXN_REPLY_KEYS", 20)
    state = KVState()
    for index in range(8):
        state.put(f"/n/{index}", b"v")
    revision = state.revision

    def run(txn: Txn):
        parts: list[bytes] = []
        return apply_request(state, "txn", {"op": "txn", "t": encode_txn(txn, parts)}, b"".join(parts))

    # 2 ranges of 8 keys, plus the put each may see: 18 keys at most, so it runs.
    assert run(Txn((), (Put("/n/new", b"v"), Range("/n/", prefix=True)), (Range("/n/", prefix=True),))).header["ok"]
    with pytest.raises(LimitExceededError, match="nothing was run"):  # 3 x (9 + 1) keys could come back
        run(Txn((), (Put("/other", b"v"), Range("/n/", prefix=True)), (Range("/n/", prefix=True),) * 2))
    assert state.revision == revision + 1 and state.get("/other").kv is None
    assert run(Txn((), (Range("/n/", prefix=True, count_only=True),) * 100)).header["ok"]  # counts cost nothing
