"""The etcd mapping of a transaction, without etcd: request fields and responses, one to one."""

import pytest
from etcd3 import etcdrpc
from etcd3.etcdrpc import kv_pb2

from backends.api import KeyValue, RangeResult
from backends.errors import ProtocolError
from backends.etcd.txnconvert import txn_request, txn_result
from backends.txn import Compare, CompareOp, Delete, DeleteResult, Put, PutResult, Range, Target, Txn, TxnResult


def test_every_part_of_a_transaction_maps_onto_its_etcd_field():
    txn = Txn(
        (Compare.value_is("/v", b"x"), Compare("/n", Target.VERSION, CompareOp.LESS, 3),
         Compare("/m", Target.MOD_REVISION, CompareOp.NOT_EQUAL, 4), Compare.exists("/c")),
        (Put("/p", b"1", 7), Delete("/d/", prefix=True), Range("/r/", prefix=True, count_only=True)),
        (Txn((), (Range("/k"),)),),
    )
    request = txn_request(txn)
    compare = [(c.key, c.target, c.result, getattr(c, c.WhichOneof("target_union"))) for c in request.compare]
    assert compare == [
        (b"/v", etcdrpc.Compare.VALUE, etcdrpc.Compare.EQUAL, b"x"),
        (b"/n", etcdrpc.Compare.VERSION, etcdrpc.Compare.LESS, 3),
        (b"/m", etcdrpc.Compare.MOD, etcdrpc.Compare.NOT_EQUAL, 4),
        (b"/c", etcdrpc.Compare.CREATE, etcdrpc.Compare.GREATER, 0),
    ]
    put, delete, ranged = request.success
    assert (put.request_put.key, put.request_put.value, put.request_put.lease, put.request_put.prev_kv) == (
        b"/p", b"1", 7, True)
    assert (delete.request_delete_range.key, delete.request_delete_range.range_end) == (b"/d/", b"/d0")
    assert (ranged.request_range.range_end, ranged.request_range.count_only) == (b"/r0", True)
    nested = request.failure[0].request_txn
    assert nested.success[0].request_range.key == b"/k" and nested.success[0].request_range.range_end == b""


def _response(succeeded, *items):
    return etcdrpc.TxnResponse(succeeded=succeeded, responses=list(items))


def test_a_put_result_continues_the_previous_incarnation_or_starts_a_new_one():
    txn = Txn((), (Put("/a", b"new", 5), Put("/b", b"fresh")), (Range("/a"),))
    previous = kv_pb2.KeyValue(key=b"/a", value=b"old", create_revision=3, mod_revision=8, version=4)
    response = _response(True, etcdrpc.ResponseOp(response_put=etcdrpc.PutResponse(prev_kv=previous)),
                         etcdrpc.ResponseOp(response_put=etcdrpc.PutResponse()))
    assert txn_result(txn, response, 12) == TxnResult(True, 12, (
        PutResult(KeyValue("/a", b"new", 3, 12, 5, 5)), PutResult(KeyValue("/b", b"fresh", 12, 12, 1, 0))))


def test_ranges_deletes_and_nested_results_map_back():
    txn = Txn((), (), (Delete("/d"), Range("/r", count_only=True), Txn((), (Range("/k"),))))
    kv = kv_pb2.KeyValue(key=b"/k", value=b"v", create_revision=2, mod_revision=3, version=1)
    response = _response(
        False,
        etcdrpc.ResponseOp(response_delete_range=etcdrpc.DeleteRangeResponse(deleted=2)),
        etcdrpc.ResponseOp(response_range=etcdrpc.RangeResponse(count=7)),
        etcdrpc.ResponseOp(response_txn=_response(True, etcdrpc.ResponseOp(
            response_range=etcdrpc.RangeResponse(kvs=[kv], count=1)))),
    )
    assert txn_result(txn, response, 9) == TxnResult(False, 9, (
        DeleteResult(2), RangeResult(9, (), 7),
        TxnResult(True, 9, (RangeResult(9, (KeyValue("/k", b"v", 2, 3, 1, 0),)),)),
    ))


@pytest.mark.parametrize("response", [
    _response(True),  # fewer responses than operations
    _response(True, etcdrpc.ResponseOp(response_range=etcdrpc.RangeResponse())),  # the wrong kind
])
def test_a_response_that_does_not_match_its_branch_is_a_protocol_error(response):
    with pytest.raises(ProtocolError):
        txn_result(Txn((), (Put("/a", b"v"),)), response, 3)
