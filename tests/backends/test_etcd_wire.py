"""The bytes of the built-in etcd transport (backends.etcd.wire): frames, header blocks, gRPC
messages and call status, checked on bytes against the ``hpack`` library. No sockets."""

import struct

import hpack
import pytest

from backends.etcd import wire
from backends.etcd.wire import ErrorCode, FrameType, Setting, WireError


# -- frames ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind, flags, stream_id, payload, expected",
    [
        (FrameType.DATA, wire.END_STREAM, 1, b"abc", b"\x00\x00\x03" b"\x00" b"\x01" b"\x00\x00\x00\x01" b"abc"),
        (FrameType.SETTINGS, wire.ACK, 0, b"", b"\x00\x00\x00" b"\x04" b"\x01" b"\x00\x00\x00\x00"),
        (FrameType.HEADERS, wire.END_HEADERS | wire.END_STREAM, 3, b"h", b"\x00\x00\x01\x01\x05\x00\x00\x00\x03h"),
        (FrameType.PING, 0, 0, b"12345678", b"\x00\x00\x08\x06\x00\x00\x00\x00\x0012345678"),
        (FrameType.DATA, 0, 2**31 - 1, b"", b"\x00\x00\x00\x00\x00\x7f\xff\xff\xff"),
        (FrameType.DATA, 0, 5, b"x" * 70_000, b"\x01\x11\x70\x00\x00\x00\x00\x00\x05" + b"x" * 70_000),
    ],
    ids=["data-end-stream", "settings-ack", "headers-flags", "ping", "max-stream-id", "24-bit-length"],
)
def test_a_frame_is_a_24_bit_length_type_flags_stream_id_and_payload(kind, flags, stream_id, payload, expected):
    assert wire.frame(kind, flags, stream_id, payload) == expected


@pytest.mark.parametrize(
    "made, expected",
    [
        (wire.window_update_frame(0, 1000), b"\x00\x00\x04\x08\x00\x00\x00\x00\x00" + struct.pack(">I", 1000)),
        (wire.window_update_frame(7, 1), b"\x00\x00\x04\x08\x00\x00\x00\x00\x07\x00\x00\x00\x01"),
        (wire.rst_stream_frame(9, ErrorCode.CANCEL), b"\x00\x00\x04\x03\x00\x00\x00\x00\x09\x00\x00\x00\x08"),
    ],
    ids=["connection-window-update", "stream-window-update", "rst-stream-cancel"],
)
def test_control_frames_have_their_fixed_layouts(made, expected):
    assert made == expected


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {Setting.ENABLE_PUSH: 0},
        {Setting.INITIAL_WINDOW_SIZE: wire.MAX_WINDOW, Setting.MAX_FRAME_SIZE: 16_384},
        {Setting.HEADER_TABLE_SIZE: 0, Setting.MAX_CONCURRENT_STREAMS: 2**32 - 1, 0xFFFF: 7},
    ],
    ids=["empty", "one", "two", "max-values-and-unknown-id"],
)
def test_settings_round_trip_through_a_settings_frame(settings):
    made = wire.settings_frame(settings)
    assert made[:3] == (6 * len(settings)).to_bytes(3, "big")
    assert made[3:9] == bytes((FrameType.SETTINGS, 0)) + b"\x00\x00\x00\x00"
    assert wire.parse_settings(made[9:]) == settings


@pytest.mark.parametrize("length", [1, 5, 7, 11])
def test_a_settings_payload_that_is_not_a_multiple_of_six_bytes_is_a_wire_error(length):
    with pytest.raises(WireError):
        wire.parse_settings(b"\x00" * length)


@pytest.mark.parametrize(
    "payload, expected",
    [
        (b"\x00\x00\x00\x07\x00\x00\x00\x00", (7, 0, b"")),
        (b"\x80\x00\x00\x07\x00\x00\x00\x0b" + b"calm down", (7, ErrorCode.ENHANCE_YOUR_CALM, b"calm down")),
    ],
    ids=["no-debug", "reserved-bit-and-debug"],
)
def test_goaway_payload_gives_last_stream_code_and_debug_data(payload, expected):
    assert wire.parse_goaway(payload) == expected


@pytest.mark.parametrize("call", [lambda: wire.parse_goaway(b"\x00" * 7), lambda: wire.parse_u32(b"\x00" * 3, "X")],
                         ids=["short-goaway", "short-u32"])
def test_short_control_payloads_are_wire_errors(call):
    with pytest.raises(WireError):
        call()


@pytest.mark.parametrize(
    "payload, flags, expected",
    [
        (b"data", 0, b"data"),
        (b"", 0, b""),
        (b"\x02data\x00\x00", wire.PADDED, b"data"),
        (b"\x00data", wire.PADDED, b"data"),
        (b"\x03\x00\x00\x00", wire.PADDED, b""),  # padding 3 of a 4-byte payload: legal, no data
        (b"\x02data\x00\x00", wire.END_STREAM, b"\x02data\x00\x00"),  # not PADDED: untouched
    ],
    ids=["unpadded", "empty", "padded", "zero-padding", "all-padding", "flag-absent"],
)
def test_strip_padding_returns_the_data_without_padding(payload, flags, expected):
    assert wire.strip_padding(payload, flags) == expected


@pytest.mark.parametrize(
    "payload",
    [b"", b"\x04\x00\x00\x00", b"\x05abc", b"\xff"],
    ids=["empty", "padding-equals-payload", "padding-longer", "only-length-byte"],
)
def test_malformed_padding_is_a_wire_error(payload):
    with pytest.raises(WireError):
        wire.strip_padding(payload, wire.PADDED)
    with pytest.raises(WireError):
        wire.header_fragment(payload, wire.PADDED | wire.END_HEADERS)


_PRIORITY = b"\x80\x00\x00\x01\x10"  # exclusive dependency on stream 1, weight 17


@pytest.mark.parametrize(
    "payload, flags, expected",
    [
        (b"block", wire.END_HEADERS, b"block"),
        (b"\x03block\x00\x00\x00", wire.PADDED, b"block"),
        (_PRIORITY + b"block", wire.PRIORITY_FLAG, b"block"),
        (b"\x02" + _PRIORITY + b"block\x00\x00", wire.PADDED | wire.PRIORITY_FLAG | wire.END_STREAM, b"block"),
        (_PRIORITY, wire.PRIORITY_FLAG, b""),
    ],
    ids=["plain", "padded", "priority", "padded-and-priority", "priority-only"],
)
def test_header_fragment_removes_padding_and_priority(payload, flags, expected):
    assert wire.header_fragment(payload, flags) == expected


@pytest.mark.parametrize(
    "payload, flags",
    [(b"\x00\x00\x00\x01", wire.PRIORITY_FLAG), (b"\x03\x00\x00\x00\x00\x00\x00", wire.PADDED | wire.PRIORITY_FLAG)],
    ids=["priority-too-short", "priority-too-short-after-padding"],
)
def test_a_headers_payload_too_short_for_its_priority_is_a_wire_error(payload, flags):
    with pytest.raises(WireError):
        wire.header_fragment(payload, flags)


# -- request header blocks ---------------------------------------------------------------------
_BASE = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/etcdserverpb.KV/Range"),
    (":authority", "etcd-0:2379"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
    ("user-agent", "etcd-elastic"),
]


@pytest.mark.parametrize(
    "timeout, metadata, extra",
    [
        (None, (), []),
        (2.5, (), [("grpc-timeout", "2500m")]),
        (None, (("token", "abc"),), [("token", "abc")]),
        (0.3, (("Token", "abc"), ("x-b", "2")), [("grpc-timeout", "300m"), ("token", "abc"), ("x-b", "2")]),
        (None, (("token", "t" * 126),), [("token", "t" * 126)]),
        (None, (("token", "t" * 127),), [("token", "t" * 127)]),  # exactly the 7-bit prefix limit
        (None, (("token", "t" * 128),), [("token", "t" * 128)]),
        (None, (("token", "t" * 300),), [("token", "t" * 300)]),
        (None, (("token", "t" * 20_000),), [("token", "t" * 20_000)]),  # a three-byte continuation
        (None, (("n" * 200, "v"),), [("n" * 200, "v")]),  # a long name
    ],
    ids=["plain", "timeout", "metadata", "timeout-and-lowercased-metadata", "value-126", "value-127", "value-128",
         "value-300", "value-20000", "long-name"],
)
def test_request_headers_decode_to_the_grpc_request_fields(timeout, metadata, extra):
    block = wire.request_headers("/etcdserverpb.KV/Range", "etcd-0:2379", "http", timeout, metadata)
    decoded = hpack.Decoder(max_header_list_size=1 << 20).decode(block)
    assert [tuple(field) for field in decoded] == _BASE + extra


def test_request_headers_never_touch_the_servers_dynamic_table():
    decoder = hpack.Decoder()
    block = wire.request_headers("/p", "h:1", "https", 1.0, (("token", "abc"),))
    decoder.decode(block)
    assert len(decoder.header_table.dynamic_entries) == 0
    assert block[0] == 0x00  # literal without indexing, new name


@pytest.mark.parametrize(
    "seconds, expected",
    [
        (0, b"1m"),
        (0.0001, b"1m"),
        (0.001, b"1m"),
        (0.0015, b"2m"),
        (0.1, b"100m"),
        (1, b"1000m"),
        (2.5, b"2500m"),
        (99_999.999, b"99999999m"),  # the largest value in milliseconds (8 digits)
        (100_000, b"100000S"),
        (100_000.5, b"100001S"),
        (1e12, b"99999999S"),  # capped at 8 digits
    ],
)
def test_grpc_timeout_is_at_most_eight_digits_and_a_unit(seconds, expected):
    value = wire.grpc_timeout(seconds)
    assert value == expected
    assert len(value) <= 9 and value[:-1].isdigit() and value[-1:] in b"mS"


# -- response header blocks --------------------------------------------------------------------
_RESPONSE = [(":status", "200"), ("content-type", "application/grpc")]
_TRAILERS = [("grpc-status", "0"), ("grpc-message", "")]


def _decoded_sequence(header_lists, setup=None):
    """Encode each list with one hpack.Encoder and decode the blocks with one HeaderDecoder."""
    encoder = hpack.Encoder()
    decoder = wire.HeaderDecoder()
    blocks, decoded = [], []
    for index, headers in enumerate(header_lists):
        if setup is not None:
            setup(index, encoder)
        block = encoder.encode(headers)
        blocks.append(block)
        decoded.append(decoder.decode(block))
    return blocks, decoded


@pytest.mark.parametrize(
    "header_lists",
    [
        [_RESPONSE, _TRAILERS, _RESPONSE, _TRAILERS, _RESPONSE, _TRAILERS],
        # x-a is the newest dynamic entry (index 62) in block 1; after x-b is added, the same
        # one-byte block 0xbe means x-b: a cache keyed on bytes must not return x-a.
        [[("x-a", "1")], [("x-a", "1")], [("x-b", "2")], [("x-b", "2")], [("x-a", "1")]],
        [[("x-a", "1")], [("x-a", "1")], [("x-a", "2")], [("x-a", "2")], [("x-a", "1")], [("x-a", "1")]],
        [_RESPONSE + [("x-" + str(n), "v" * 500)] for n in range(12)] + [_RESPONSE, _RESPONSE],  # evictions
        [[("grpc-message", "caf\u00e9 %25"), ("grpc-status", "2")]] * 3,
    ],
    ids=["grpc-responses", "index-62-reused", "value-changes", "evictions", "non-ascii"],
)
def test_header_decoder_follows_the_dynamic_table_across_blocks(header_lists):
    blocks, decoded = _decoded_sequence(header_lists)
    assert decoded == [dict(headers) for headers in header_lists]


def test_an_indexed_only_block_is_decoded_afresh_after_the_table_changed():
    lists = [[("x-a", "1")], [("x-a", "1")], [("x-b", "2")], [("x-b", "2")]]
    blocks, decoded = _decoded_sequence(lists)
    assert blocks[1] == blocks[3] == b"\xbe"  # the same bytes, meaning different fields
    assert decoded[1] == {"x-a": "1"} and decoded[3] == {"x-b": "2"}


def test_a_table_size_update_evicts_and_later_blocks_still_decode():
    def shrink_then_grow(index, encoder):
        if index == 2:
            encoder.header_table_size = 0  # the next block starts with a size update: table emptied
        if index == 3:
            encoder.header_table_size = 4096

    lists = [[("x-a", "1")], [("x-a", "1")], [("x-a", "1")], [("x-c", "3")], [("x-c", "3")], [("x-a", "1")]]
    blocks, decoded = _decoded_sequence(lists, shrink_then_grow)
    assert blocks[2][0] & 0xE0 == 0x20  # a dynamic table size update
    assert decoded == [dict(headers) for headers in lists]


@pytest.mark.parametrize("block", [b"\xff\xff\xff\xff\xff\xff", b"\xc0", b"\x40\x05ab"],
                         ids=["integer-overflow", "index-out-of-range", "truncated-literal"])
def test_an_undecodable_header_block_is_a_wire_error(block):
    with pytest.raises(WireError):
        wire.HeaderDecoder().decode(block)


# -- gRPC messages -----------------------------------------------------------------------------
def _msg(body):
    return wire.grpc_message(body)


def test_a_grpc_message_is_a_zero_flag_a_32_bit_length_and_the_body():
    assert wire.grpc_message(b"abc") == b"\x00\x00\x00\x00\x03abc"
    assert wire.grpc_message(b"") == b"\x00\x00\x00\x00\x00"


@pytest.mark.parametrize(
    "chunks, expected, pending",
    [
        ([_msg(b"one")], [[b"one"]], 0),
        ([_msg(b"one") + _msg(b"") + _msg(b"three")], [[b"one", b"", b"three"]], 0),
        ([_msg(b"hello")[:2], _msg(b"hello")[2:7], _msg(b"hello")[7:]], [[], [], [b"hello"]], 0),
        ([_msg(b"ab")[:5], _msg(b"ab")[5:]], [[], [b"ab"]], 0),
        ([_msg(b"one") + _msg(b"two")[:4]], [[b"one"]], 4),
        ([_msg(b"one") + _msg(b"twotwo")[:8]], [[b"one"]], 8),
        ([_msg(b"x" * 70_000)[:16_384], _msg(b"x" * 70_000)[16_384:]], [[], [b"x" * 70_000]], 0),
        ([_msg(b"a")[:3], _msg(b"a")[3:] + _msg(b"b"), _msg(b"c")[:1]], [[], [b"a", b"b"], []], 1),
    ],
    ids=["one", "several-in-one-chunk", "split-in-prefix-and-body", "split-after-prefix", "partial-prefix-left",
         "partial-body-left", "large-over-frames", "mixed"],
)
def test_message_assembler_cuts_data_into_messages(chunks, expected, pending):
    assembler = wire.MessageAssembler()
    assert [assembler.feed(chunk) for chunk in chunks] == expected
    assert assembler.pending == pending


def test_message_assembler_works_byte_by_byte():
    stream = _msg(b"first") + _msg(b"") + _msg(b"second")
    assembler = wire.MessageAssembler()
    messages = [message for index in range(len(stream)) for message in assembler.feed(stream[index : index + 1])]
    assert messages == [b"first", b"", b"second"]
    assert assembler.pending == 0


@pytest.mark.parametrize(
    "chunks",
    [[b"\x01\x00\x00\x00\x01x"], [_msg(b"ok") + b"\x01\x00\x00\x00\x00"], [b"\x01\x00", b"\x00\x00\x00"]],
    ids=["alone", "after-a-good-message", "split-prefix"],
)
def test_a_compressed_message_is_a_wire_error(chunks):
    assembler = wire.MessageAssembler()
    with pytest.raises(WireError):
        for chunk in chunks:
            assembler.feed(chunk)


# -- call status -------------------------------------------------------------------------------
_OK_HEADERS = {":status": "200", "content-type": "application/grpc"}


@pytest.mark.parametrize(
    "headers, trailers, code, message",
    [
        (_OK_HEADERS, {"grpc-status": "0"}, 0, ""),
        (_OK_HEADERS, {"grpc-status": "0", "grpc-message": ""}, 0, ""),
        (_OK_HEADERS, {"grpc-status": "5", "grpc-message": "etcdserver: key not found"}, 5,
         "etcdserver: key not found"),
        (_OK_HEADERS, {"grpc-status": "3", "grpc-message": "bad%20key%3A%20%25x%0Aline+2"}, 3, "bad key: %x\nline+2"),
        (_OK_HEADERS, {"grpc-status": "16", "grpc-message": "caf%C3%A9"}, 16, "caf\u00e9"),
        ({**_OK_HEADERS, "grpc-status": "9", "grpc-message": "not%20now"}, None, 9, "not now"),  # trailers-only
        ({**_OK_HEADERS, "grpc-status": "0"}, None, 0, ""),
        (_OK_HEADERS, {"grpc-status": "x"}, 13, "the server sent an unreadable grpc-status 'x'"),
    ],
    ids=["ok", "ok-empty-message", "error", "percent-encoded", "utf8-percent-encoded", "trailers-only-error",
         "trailers-only-ok", "unreadable-status"],
)
def test_call_status_of_a_grpc_response(headers, trailers, code, message):
    assert wire.call_status(headers, trailers) == (code, message)


@pytest.mark.parametrize(
    "headers, trailers, code, status_text",
    [
        ({":status": "404", "content-type": "text/html"}, None, 12, "HTTP status 404 (text/html)"),
        ({":status": "503"}, None, 14, "HTTP status 503 (no content type)"),
        ({":status": "502"}, {}, 14, "HTTP status 502"),
        ({":status": "500"}, None, 2, "HTTP status 500"),
        ({":status": "418"}, None, 2, "HTTP status 418"),
        ({":status": "401"}, None, 16, "HTTP status 401"),
        ({":status": "200", "content-type": "application/grpc"}, {}, 2, "HTTP status 200"),  # no grpc-status
        ({":status": "503", "grpc-status": "0"}, None, 14, "HTTP status 503"),  # HTTP status wins
        ({}, None, 13, "HTTP status none"),
    ],
    ids=["404", "503", "502-with-empty-trailers", "500-other", "418-other", "401", "200-without-grpc-status",
         "503-with-grpc-status", "no-status"],
)
def test_call_status_without_a_grpc_status_maps_the_http_status(headers, trailers, code, status_text):
    got_code, message = wire.call_status(headers, trailers)
    assert got_code == code
    assert status_text in message and "not a gRPC status" in message
