"""The bytes of gRPC over HTTP/2 (RFC 9113, RFC 7541, gRPC's PROTOCOL-HTTP2): pure functions.

Frames, request header blocks, gRPC's length-prefixed messages, and the status of a finished
call. No I/O here; :mod:`backends.etcd.transport` drives a connection with these, and every
rule is unit-tested on bytes (tests/backends/test_etcd_wire.py).

Header blocks we send use only "literal without indexing, new name" (RFC 7541 §6.2.2): they
never touch the server's dynamic table, so they need no encoder state and can be cached.
Header blocks we receive are decoded with the ``hpack`` library (Huffman and the dynamic
table), see :class:`HeaderDecoder`.
"""

from __future__ import annotations

import enum
import struct
import urllib.parse
from typing import Iterable

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER_BYTES = 9
DEFAULT_MAX_FRAME = 16_384
DEFAULT_WINDOW = 65_535
MAX_WINDOW = 2**31 - 1


class FrameType(enum.IntEnum):
    DATA = 0x0
    HEADERS = 0x1
    PRIORITY = 0x2
    RST_STREAM = 0x3
    SETTINGS = 0x4
    PUSH_PROMISE = 0x5
    PING = 0x6
    GOAWAY = 0x7
    WINDOW_UPDATE = 0x8
    CONTINUATION = 0x9


END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20


class Setting(enum.IntEnum):
    HEADER_TABLE_SIZE = 0x1
    ENABLE_PUSH = 0x2
    MAX_CONCURRENT_STREAMS = 0x3
    INITIAL_WINDOW_SIZE = 0x4
    MAX_FRAME_SIZE = 0x5
    MAX_HEADER_LIST_SIZE = 0x6


class ErrorCode(enum.IntEnum):
    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


class WireError(Exception):
    """The peer broke HTTP/2 or gRPC framing (the connection cannot be trusted any more)."""


# -- frames ------------------------------------------------------------------------------------
def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame: 24-bit length, type, flags, 31-bit stream id, payload."""
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream_id) + payload


def settings_frame(settings: dict[int, int]) -> bytes:
    return frame(FrameType.SETTINGS, 0, 0, b"".join(struct.pack(">HI", key, value) for key, value in settings.items()))


def parse_settings(payload: bytes) -> dict[int, int]:
    """A SETTINGS payload as {identifier: value}. Raises WireError for a bad length."""
    if len(payload) % 6:
        raise WireError(f"a SETTINGS frame of {len(payload)} bytes (not a multiple of 6)")
    return {key: value for key, value in struct.iter_unpack(">HI", payload)}


def window_update_frame(stream_id: int, increment: int) -> bytes:
    return frame(FrameType.WINDOW_UPDATE, 0, stream_id, struct.pack(">I", increment))


def rst_stream_frame(stream_id: int, code: ErrorCode) -> bytes:
    return frame(FrameType.RST_STREAM, 0, stream_id, struct.pack(">I", code))


def parse_u32(payload: bytes, what: str) -> int:
    if len(payload) < 4:
        raise WireError(f"a {what} frame of {len(payload)} bytes")
    return struct.unpack_from(">I", payload)[0] & 0x7FFF_FFFF


def parse_goaway(payload: bytes) -> tuple[int, int, bytes]:
    """(last stream id, error code, debug data) of a GOAWAY payload."""
    if len(payload) < 8:
        raise WireError(f"a GOAWAY frame of {len(payload)} bytes")
    last, code = struct.unpack_from(">II", payload)
    return last & 0x7FFF_FFFF, code, payload[8:]


def strip_padding(payload: bytes, flags: int) -> bytes:
    """The data of a DATA or HEADERS payload without its padding. Raises WireError if malformed."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise WireError("a padded frame whose padding is longer than the frame")
    return payload[1 : len(payload) - payload[0]]


def header_fragment(payload: bytes, flags: int) -> bytes:
    """The header block fragment of a HEADERS payload (padding and priority removed)."""
    data = strip_padding(payload, flags)
    if flags & PRIORITY_FLAG:
        if len(data) < 5:
            raise WireError("a HEADERS frame too short for its priority fields")
        data = data[5:]
    return data


# -- header blocks -----------------------------------------------------------------------------
def _prefixed_int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """A header field as "literal without indexing, new name", no Huffman coding."""
    return b"\x00" + _prefixed_int(len(name), 7, 0) + name + _prefixed_int(len(value), 7, 0) + value


def request_headers(
    path: str, authority: str, scheme: str, timeout: float | None, metadata: Iterable[tuple[str, str]] = ()
) -> bytes:
    """The header block of a gRPC request. Metadata names must be lowercase ASCII."""
    fields = [
        (b":method", b"POST"),
        (b":scheme", scheme.encode()),
        (b":path", path.encode()),
        (b":authority", authority.encode()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"user-agent", b"etcd-elastic"),
    ]
    if timeout is not None:
        fields.append((b"grpc-timeout", grpc_timeout(timeout)))
    fields += [(name.lower().encode(), value.encode()) for name, value in metadata]
    return b"".join(_literal(name, value) for name, value in fields)


def timeout_field(seconds: float) -> bytes:
    """The ``grpc-timeout`` header field, to append to a block of :func:`request_headers` made
    without a timeout (regular fields may come in any order after the pseudo-headers)."""
    return _literal(b"grpc-timeout", grpc_timeout(seconds))


def header_frames(stream_id: int, block: bytes, max_frame: int) -> bytes:
    """A header block as one HEADERS frame, or HEADERS plus CONTINUATION frames when it is
    larger than the peer's maximum frame size (RFC 9113 §4.3)."""
    if len(block) <= max_frame:
        return frame(FrameType.HEADERS, END_HEADERS, stream_id, block)
    pieces = [block[start : start + max_frame] for start in range(0, len(block), max_frame)]
    frames = [frame(FrameType.HEADERS, 0, stream_id, pieces[0])]
    frames += [frame(FrameType.CONTINUATION, 0, stream_id, piece) for piece in pieces[1:-1]]
    frames.append(frame(FrameType.CONTINUATION, END_HEADERS, stream_id, pieces[-1]))
    return b"".join(frames)


def grpc_timeout(seconds: float) -> bytes:
    """gRPC's ``grpc-timeout`` value: at most 8 digits and a unit (we use milliseconds or seconds)."""
    millis = max(int(seconds * 1000 + 0.999), 1)
    if millis < 100_000_000:
        return b"%dm" % millis
    return b"%dS" % min(int(seconds + 0.999), 99_999_999)


class HeaderDecoder:
    """Decodes the server's header blocks (stateful: HPACK's dynamic table), with a cache.

    grpc-go sends the same few headers on every response; after the first they are fully
    indexed, a block of 1-byte references. Decoding such a block does not change the dynamic
    table, so its result is cached until a block that may change the table is decoded.
    """

    def __init__(self) -> None:
        self._decoder = hpack.Decoder()
        self._cache: dict[bytes, dict[str, str]] = {}

    def decode(self, block: bytes) -> dict[str, str]:
        """The block's fields as {name: value} (a repeated name keeps the last); the dict may be
        shared with later calls, so callers must not modify it. Raises WireError."""
        cached = self._cache.get(block)
        if cached is not None:
            return cached
        try:
            fields = self._decoder.decode(block)
        except hpack.HPACKError as error:
            raise WireError(f"an undecodable header block ({error})") from error
        decoded = {str(name): str(value) for name, value in fields}
        if all(byte & 0x80 for byte in block):  # only indexed fields: the table did not change
            self._cache[block] = decoded
        else:
            self._cache.clear()
        return decoded


# -- gRPC messages -----------------------------------------------------------------------------
def grpc_message(body: bytes) -> bytes:
    """One uncompressed length-prefixed gRPC message."""
    return b"\x00" + struct.pack(">I", len(body)) + body


class MessageAssembler:
    """Cuts the DATA bytes of one stream into gRPC messages (which may span frames)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The messages completed by ``data``. Raises WireError for a compressed message."""
        buffer = self._buffer
        buffer += data
        messages: list[bytes] = []
        position = 0
        while len(buffer) - position >= 5:
            if buffer[position]:
                raise WireError("a compressed gRPC message, though no compression was negotiated")
            length = int.from_bytes(buffer[position + 1 : position + 5], "big")
            end = position + 5 + length
            if len(buffer) < end:
                break
            messages.append(bytes(buffer[position + 5 : end]))
            position = end
        if position:
            del buffer[:position]
        return messages

    @property
    def pending(self) -> int:
        """Bytes of an incomplete message still buffered."""
        return len(self._buffer)


# -- call status -------------------------------------------------------------------------------
_HTTP_TO_GRPC = {400: 13, 401: 16, 403: 7, 404: 12, 429: 14, 502: 14, 503: 14, 504: 14}
"""gRPC's mapping of an HTTP status without a grpc-status (doc/http-grpc-status-mapping.md)."""

RST_TO_GRPC = {
    ErrorCode.NO_ERROR: 13,
    ErrorCode.REFUSED_STREAM: 14,
    ErrorCode.CANCEL: 1,
    ErrorCode.ENHANCE_YOUR_CALM: 8,
    ErrorCode.INADEQUATE_SECURITY: 7,
}
"""gRPC status code for an RST_STREAM error code (anything else: INTERNAL, 13)."""


def call_status(headers: dict[str, str], trailers: dict[str, str] | None) -> tuple[int, str]:
    """(gRPC status code, message) of a finished call from its headers and trailers.

    A response without ``grpc-status`` (not a gRPC server) gets the code gRPC maps its HTTP
    status to, and a message saying what answered.
    """
    merged = dict(headers)
    if trailers:
        merged.update(trailers)
    http_status = merged.get(":status", "")
    raw = merged.get("grpc-status")
    if raw is None or http_status != "200":
        try:
            code = _HTTP_TO_GRPC.get(int(http_status), 2)
        except ValueError:
            code = 13
        kind = merged.get("content-type", "no content type")
        return code, f"the server answered HTTP status {http_status or 'none'} ({kind}), not a gRPC status"
    try:
        code = int(raw)
    except ValueError:
        return 13, f"the server sent an unreadable grpc-status {raw!r}"
    return code, urllib.parse.unquote(merged.get("grpc-message", ""))
