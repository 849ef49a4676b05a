"""The TCP store's wire format: frames, values, events and errors, without sockets."""

import struct

import pytest

from backends.api import EventType, KeyValue, WatchEvent
from backends.errors import BackendAuthError, CompactedError, LeaseNotFoundError, ProtocolError, ValueTooLargeError
from backends.tcp.protocol import (
    FrameDecoder,
    PayloadReader,
    encode_frame,
    error_from_wire,
    error_to_wire,
    event_batches,
    event_to_wire,
    kv_to_wire,
)


def event(revision, key="k", value=b"v"):
    return WatchEvent(EventType.PUT, KeyValue(key, value, revision, revision))


def test_frames_round_trip_when_split_at_every_byte():
    stream = encode_frame({"op": "put", "k": "nœud"}, (b"\x00\xff",)) + encode_frame({"i": 2})
    decoder = FrameDecoder()
    frames = [frame for byte in range(len(stream)) for frame in decoder.feed(stream[byte : byte + 1])]
    decoded = [(frame.header, frame.payload) for frame in frames]
    assert decoded == [({"op": "put", "k": "nœud"}, b"\x00\xff"), ({"i": 2}, b"")]
    assert decoder.pending_bytes == 0


def test_several_frames_in_one_read_are_all_decoded():
    stream = b"".join(encode_frame({"i": number}) for number in range(5))
    assert [frame.header["i"] for frame in FrameDecoder().feed(memoryview(stream))] == list(range(5))


@pytest.mark.parametrize(
    "data",
    [
        struct.pack("!II", 10_000, 4),  # over the limit
        struct.pack("!II", 2, 0),  # shorter than its own header length field
        struct.pack("!II", 6, 9) + b"{}",  # header overruns the frame
        struct.pack("!II", 8, 4) + b"{nop",  # not JSON
        struct.pack("!II", 6, 2) + b"[]",  # JSON but not an object
        struct.pack("!II", 7, 3) + b"{}x",  # trailing bytes after the object
    ],
)
def test_malformed_or_oversized_frames_raise_protocol_error(data):
    with pytest.raises(ProtocolError):
        FrameDecoder(max_frame_bytes=1000).feed(data)


def test_key_values_and_events_travel_in_the_header_with_values_in_the_payload():
    parts = []
    kv = KeyValue("a", b"\x00binary", 3, 5, 2, 77)
    items = [kv_to_wire(kv, parts), event_to_wire(WatchEvent(EventType.DELETE, KeyValue("b", b"", 0, 6, 0)), parts)]
    reader = PayloadReader(b"".join(parts))
    assert reader.kv(items[0]) == kv
    decoded = reader.event(items[1])
    assert decoded.type is EventType.DELETE and decoded.kv.key == "b" and decoded.revision == 6


@pytest.mark.parametrize("item", [None, ["k", 1, 1, 1, 0, 99], [1, 1, 1, 1, 0, 0], ["k", 1, 1]])
def test_malformed_entries_raise_protocol_error(item):
    with pytest.raises(ProtocolError):
        PayloadReader(b"short").kv(item)


def test_event_batches_never_split_a_revision():
    events = [event(1), event(2, "a"), event(2, "b"), event(2, "c"), event(3)]
    batches = list(event_batches(events, max_bytes=1))
    assert [[e.revision for e in batch] for batch in batches] == [[1], [2, 2, 2], [3]]
    assert list(event_batches(events, max_bytes=10_000)) == [events]


@pytest.mark.parametrize(
    "error",
    [
        CompactedError("gone", requested_revision=3, compact_revision=9),
        LeaseNotFoundError("no lease"),
        ValueTooLargeError("too big"),
        BackendAuthError("bad token"),
        ProtocolError("bad request"),
    ],
)
def test_errors_round_trip_with_their_type_and_message(error):
    back = error_from_wire(error_to_wire(error))
    assert type(back) is type(error) and str(back) == str(error)
    if isinstance(error, CompactedError):
        assert (back.requested_revision, back.compact_revision) == (3, 9)


def test_invalid_argument_errors_come_back_as_value_error():
    assert type(error_from_wire(error_to_wire(ValueError("ttl")))) is ValueError
