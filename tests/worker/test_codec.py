"""The state codec: round trips of real module and optimizer states, bounds, and clear errors."""

from __future__ import annotations

import json
import math

import pytest
import torch

from elastic.worker.codec import StateHeader, assemble, check_state, decode_header, encode_state
from elastic.worker.errors import StateTransferError


def _round_trip(state, coalesce_bytes=1024 * 1024):
    encoded = encode_state(state, coalesce_bytes)
    header = decode_header(encoded.header)
    chunks = [torch.empty(numel, dtype=dtype) for dtype, numel in header.chunks]
    for target, sent in zip(chunks, encoded.chunks, strict=True):
        target.copy_(sent)  # what the wire does
    return encoded, assemble(header, chunks)


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return (type(a) is type(b) and list(a) == list(b) and [type(k) for k in a] == [type(k) for k in b]
                and all(_same(a[k], b[k]) for k in a))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


def _trained():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    return model, opt


def test_a_module_and_adam_state_round_trip_exactly_and_load():
    model, opt = _trained()
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "epoch": 3, "name": "run", "lr": 0.5,
             "nan": float("nan"), "inf": float("-inf"), "none": None, "pair": (1, "a"), "seen": [1, 2.5, True]}
    _, got = _round_trip(state)
    assert _same(state, got)
    assert got["model"]._metadata == state["model"]._metadata  # BatchNorm's version travels
    fresh, fresh_opt = _trained()
    fresh.load_state_dict(got["model"])
    fresh_opt.load_state_dict(got["opt"])
    assert [type(key) for key in got["opt"]["state"]] == [int] * 6  # optimizer ids stay ints


def test_small_tensors_are_packed_and_large_ones_sent_alone():
    state = {"a": torch.ones(10), "b": torch.zeros(3, dtype=torch.int64), "c": torch.full((5,), 2.0),
             "big": torch.arange(2000, dtype=torch.float32), "d": torch.ones(2, 2)}
    encoded, got = _round_trip(state, coalesce_bytes=4096)
    header = json.loads(encoded.header)
    assert header["chunks"] == [["float32", 19], ["int64", 3], ["float32", 2000]]
    assert _same(state, got)
    got["a"].add_(1)
    assert torch.equal(got["c"], torch.full((5,), 2.0))  # packed tensors are cloned apart


def test_a_pack_is_split_when_it_would_pass_the_chunk_size():
    state = [torch.ones(200), torch.ones(200), torch.ones(200)]  # 800 bytes each
    encoded, got = _round_trip(state, coalesce_bytes=2000)
    assert [numel for _, numel in json.loads(encoded.header)["chunks"]] == [400, 200]
    assert _same(state, got)


def test_non_contiguous_and_zero_sized_tensors_round_trip():
    state = {"t": torch.arange(12.0).reshape(3, 4).t(), "empty": torch.zeros(0, 3), "scalar": torch.tensor(3.5)}
    _, got = _round_trip(state)
    assert _same({k: v.contiguous() for k, v in state.items()}, got)


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"f": lambda: 1}, r"holds a function at state_dict\(\)\['f'\]"),
        ({"s": {1, 2}}, "holds a set"),
        ({"sparse": torch.eye(2).to_sparse()}, "only dense tensors"),
        ({"nested": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])}, "only dense tensors"),
        ({"c": torch.zeros(2, dtype=torch.float8_e4m3fn)}, "supported dtypes"),
    ],
)
def test_a_state_that_cannot_be_sent_is_named(state, message):
    with pytest.raises(StateTransferError, match=message):
        check_state(state)


def test_a_too_deep_state_is_refused():
    state: list = []
    for _ in range(100):
        state = [state]
    with pytest.raises(StateTransferError, match="nested deeper"):
        check_state(state)


def _header(**changes) -> bytes:
    header = {"v": 1, "skeleton": {"$tensor": 0}, "chunks": [["float32", 4]], "tensors": [[0, 0, [2, 2]]], **changes}
    return json.dumps(header).encode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xff", "not UTF-8 JSON"),
        (_header(v=2), "not version 1"),
        (_header(chunks=[["object", 4]]), "bad chunk"),
        (_header(chunks=[["float32", -1]]), "bad chunk"),
        (_header(chunks="x"), "chunks is not a list"),
        (_header(tensors=[[1, 0, [2]]]), "bad tensor"),
        (_header(tensors=[[0, 2, [2, 2]]]), "past the end of chunk 0"),
        (_header(tensors=[[0, 0, [2, -2]]]), "bad shape"),
        (_header(tensors=[[0, 0, [True]]]), "bad shape"),
        (_header(tensors=[[0, 0, [1] * 65]]), "bad shape"),  # more than MAX_DIMS
        (_header(tensors=[[0, 0, [2**63]]]), "bad shape"),
        (_header(tensors=[[0, 2**63, [0]]]), "bad tensor"),
        (_header(chunks=[["float32", 10**30]]), "bad chunk"),
        (_header(chunks=[["float32", 4]] + [["bool", 0]] * 13), "more than 12 empty chunks"),
        (_header(tensors=[[0, 0, [3]], [0, 2, [2]]]), "overlap in chunk 0 at element 2"),
        (_header(tensors=[[0, 1, [3]]] * 2), "overlap in chunk 0 at element 1"),
    ],
)
def test_a_malformed_header_is_refused_before_anything_is_allocated(data, message):
    with pytest.raises(StateTransferError, match=message):
        decode_header(data)


def test_a_header_of_the_review_is_refused_by_its_bounds():
    """Issue 34, item 4: 250 tensors over one 4 MiB chunk (each would be cloned: 999 MiB from an
    8 KB header), and one shape of 600,000 dimensions (a quadratic product, 2.6 s holding the GIL)."""
    overlapping = _header(skeleton=[{"$tensor": i} for i in range(250)], chunks=[["float32", 1 << 20]],
                          tensors=[[0, 1, [(1 << 20) - 1]]] * 250)
    with pytest.raises(StateTransferError, match="overlap in chunk 0"):
        decode_header(overlapping)
    with pytest.raises(StateTransferError, match="bad shape"):
        decode_header(_header(tensors=[[0, 0, [2] * 600_000]]))


def test_empty_tensors_and_adjacent_ranges_are_not_overlaps():
    header = decode_header(_header(chunks=[["float32", 4], ["int64", 0]],
                                   tensors=[[0, 0, [2]], [0, 2, [0]], [0, 2, [1, 2]], [0, 2, [0, 5]], [1, 0, [0]]]))
    assert header.nbytes == 16 and len(header.tensors) == 5


def test_a_state_the_encoder_makes_always_passes_the_decoder():
    state = {"empty": torch.zeros(0, 3), "e2": torch.zeros(0, dtype=torch.int64), "s": torch.tensor(1.0),
             "packed": [torch.ones(3) for _ in range(50)], "big": torch.ones(600), "wide": torch.zeros([1] * 64)}
    encoded, got = _round_trip(state, coalesce_bytes=1024)
    assert _same(state, got)
    assert decode_header(encoded.header).nbytes == sum(c.numel() * c.element_size() for c in encoded.chunks)


def test_a_tensor_of_more_dimensions_than_can_be_sent_is_named():
    with pytest.raises(StateTransferError, match=r"65 dimensions at state_dict\(\)\['deep'\]"):
        check_state({"deep": torch.zeros([1] * 65)})


@pytest.mark.parametrize(
    ("skeleton", "message"),
    [
        ({"$tensor": 1}, "names tensor 1 of 1"),
        ({"$object": 1}, "unknown value"),
        ({"$dict": [[1]]}, "bad dict entry"),
        ({"$dict": [[[1], 2]]}, "unhashable key"),
        ({"$tuple": 3}, "unknown value"),
    ],
)
def test_a_malformed_skeleton_is_refused(skeleton, message):
    header = StateHeader(skeleton, ((torch.float32, 4),), ((0, 0, (2, 2)),))
    with pytest.raises(StateTransferError, match=message):
        assemble(header, [torch.zeros(4)])
