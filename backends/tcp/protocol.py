"""The TCP store's wire protocol: versioned, length-prefixed frames of a JSON header plus raw bytes.

A connection starts with a handshake. Each side first sends :data:`MAGIC` (8 bytes; its line
break makes an HTTP server answer a stray client at once), then frames. The client's first
frame is the hello ``{"v": PROTOCOL_VERSION, "token": ..., "max_frame": ...}``; the server
answers ``{"v": ..., "store": <store id>, "max_value": ..., "crev": ...}`` or an error frame
``{"err": "auth" | "version", "msg": ...}`` and closes.

A frame is ``!I`` frame length (of what follows), ``!I`` header length, the header (compact
JSON, an object), and the payload: the raw bytes of every value the header mentions, in the
order mentioned. Keys and revisions travel in the header, values never do, so binary values
need no escaping. Requests carry an id ``"i"`` that the response echoes; watch pushes carry
the watch id ``"w"`` instead. Never pickle: a peer can only make us parse JSON.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any, Iterator, NamedTuple, Sequence

from backends.api import EventType, KeyValue, WatchEvent
from backends.errors import (
    BackendAuthError,
    BackendError,
    CompactedError,
    BackendConnectionError,
    LeaseNotFoundError,
    LimitExceededError,
    ProtocolError,
    ValueTooLargeError,
)
from backends.untrusted import quote

PROTOCOL_VERSION = 2
"""Version 2 runs conditional writes as one ``txn`` op (:mod:`backends.tcp.txnwire`); version 1's
``put_if``, ``del_if`` and ``put_claim`` are gone, so peers of different versions refuse each other
in the handshake rather than failing at the first write."""
MAGIC = b"ESTORE1\n"
DEFAULT_PORT = 29400
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024

_PREFIX = struct.Struct("!II")
_LENGTH = struct.Struct("!I")
_EVENT_TYPES = {EventType.PUT: "p", EventType.DELETE: "d"}
_EVENT_CODES = {code: kind for kind, code in _EVENT_TYPES.items()}
_dumps = json.JSONEncoder(separators=(",", ":")).encode
_raw_decode = json.JSONDecoder().raw_decode  # decode() would also run two whitespace regexes


class Frame(NamedTuple):
    """One decoded frame: its JSON header and its raw payload (a named tuple: it is made per request)."""

    header: dict[str, Any]
    payload: bytes = b""


def encode_frame(header: dict[str, Any], parts: Sequence[bytes] = ()) -> bytes:
    """Encode one frame; ``parts`` are the values the header mentions, in order."""
    head = _dumps(header).encode()
    size = 4 + len(head) + sum(len(part) for part in parts)
    return b"".join((_PREFIX.pack(size, len(head)), head, *parts))


class FrameTooLargeError(ProtocolError, ValueTooLargeError):
    """A frame or its header is over the receiver's limit (travels as "too_large")."""


class FrameDecoder:
    """Splits a byte stream into frames, refusing any frame over ``max_frame_bytes`` or header
    over ``max_header_bytes`` from its length prefix alone (before buffering or parsing it).

    Raises (from :meth:`feed`):
        FrameTooLargeError: a frame or its header is over the limit.
        ProtocolError: a frame is malformed, or its header is not a JSON object; the stream
            cannot be resynchronized, so the connection must be dropped.
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, max_header_bytes: int | None = None) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.max_header_bytes = max_header_bytes
        self._buffer = bytearray()

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete frame held back."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Add received bytes; return every frame now complete.

        When nothing is held back the frames are parsed straight from ``data`` (the common
        case: one read, whole frames), so only an incomplete tail is copied.
        """
        buffer = self._buffer
        if buffer:
            buffer += data
            data = buffer
        frames: list[Frame] = []
        start = 0
        end = len(data)
        while end - start >= 4:
            (size,) = _LENGTH.unpack_from(data, start)
            if size > self.max_frame_bytes:
                raise FrameTooLargeError(f"A frame of {size} bytes is over the {self.max_frame_bytes}-byte limit.")
            if size < 4:
                raise ProtocolError(f"A frame of {size} bytes is too short to hold its header length.")
            if self.max_header_bytes is not None and end - start >= 8:
                (head_size,) = _LENGTH.unpack_from(data, start + 4)
                if head_size > self.max_header_bytes:
                    raise FrameTooLargeError(
                        f"A frame header of {head_size} bytes is over the {self.max_header_bytes}-byte limit."
                    )
            if end - start < 4 + size:
                break
            frames.append(_parse_frame(data, start, start + 4 + size))
            start += 4 + size
        if data is buffer:
            del buffer[:start]
        elif start < end:
            buffer += data[start:]
        return frames


def _parse_frame(data: bytes | bytearray | memoryview, start: int, end: int) -> Frame:
    _, head_size = _PREFIX.unpack_from(data, start)
    head_end = start + 8 + head_size
    if head_end > end:
        raise ProtocolError(f"A frame header of {head_size} bytes overruns its frame.")
    try:
        text = str(data[start + 8 : head_end], "utf-8")
        header, parsed = _raw_decode(text)
    except RecursionError:  # "[" * 50000: the C decoder gives up, which is bad input, not a bug
        raise ProtocolError("A frame header is JSON nested too deeply to decode.") from None
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        raise ProtocolError(f"A frame header is not valid JSON: {quote(error)}") from None
    if type(header) is not dict or parsed != len(text):
        raise ProtocolError("A frame header is not one JSON object.")
    return Frame(header, bytes(data[head_end:end]) if head_end < end else b"")


def tune_socket(sock: Any) -> None:
    """Socket options both ends use: no Nagle delay, and TCP keepalive so a peer that vanished
    without closing (host crash, partition) is noticed within about 15 s even when idle."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 3), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):  # Linux and recent macOS
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


# -- keys, values and events in frames -------------------------------------------------------
def kv_to_wire(kv: KeyValue, parts: list[bytes]) -> list[Any]:
    """Header form of ``kv``; appends its value to ``parts``."""
    parts.append(kv.value)
    return [kv.key, kv.create_revision, kv.mod_revision, kv.version, kv.lease, len(kv.value)]


def event_to_wire(event: WatchEvent, parts: list[bytes]) -> list[Any]:
    """Header form of ``event``; appends its value to ``parts``."""
    return [_EVENT_TYPES[event.type], *kv_to_wire(event.kv, parts)]


class PayloadReader:
    """Hands out the values of a frame's payload in order, decoding header entries.

    Raises (from every method):
        ProtocolError: an entry is malformed or the payload is shorter than it claims.
    """

    def __init__(self, payload: bytes) -> None:
        self._payload = payload
        self._offset = 0

    def kv(self, item: Any) -> KeyValue:
        """Decode a :func:`kv_to_wire` entry."""
        try:
            key, create, mod, version, lease, size = item
            end = self._offset + size
            if not isinstance(key, str) or size < 0 or end > len(self._payload):
                raise ValueError("bad key or value size")
            value = self._payload[self._offset : end]
            self._offset = end
            return KeyValue(key, value, int(create), int(mod), int(version), int(lease))
        except (TypeError, ValueError) as error:
            raise ProtocolError(f"Malformed key-value entry {item!r:.80}: {error}") from error

    def kv_or_none(self, item: Any) -> KeyValue | None:
        return None if item is None else self.kv(item)

    def event(self, item: Any) -> WatchEvent:
        """Decode an :func:`event_to_wire` entry."""
        if not isinstance(item, list) or not item or item[0] not in _EVENT_CODES:
            raise ProtocolError(f"Malformed watch event {item!r:.80}.")
        return WatchEvent(_EVENT_CODES[item[0]], self.kv(item[1:]))


def event_batches(events: Sequence[WatchEvent], max_bytes: int) -> Iterator[list[WatchEvent]]:
    """Split events into batches of roughly at most ``max_bytes``, never splitting a revision.

    A watcher drops events at or below the last revision it got, so a revision's events
    must arrive in one frame. A single revision larger than ``max_bytes`` is one batch.
    """
    batch: list[WatchEvent] = []
    size = 0
    index = 0
    while index < len(events):
        revision = events[index].revision
        group_end = index
        while group_end < len(events) and events[group_end].revision == revision:
            group_end += 1
        group = events[index:group_end]
        group_size = sum(len(event.kv.value) + 6 * len(event.kv.key) + 64 for event in group)
        if batch and size + group_size > max_bytes:
            yield batch
            batch, size = [], 0
        batch.extend(group)
        size += group_size
        index = group_end
    if batch:
        yield batch


# -- errors ----------------------------------------------------------------------------------
def error_to_wire(error: BaseException) -> dict[str, Any]:
    """Header fields describing ``error`` (merge into a response or push)."""
    fields: dict[str, Any] = {"msg": str(error)}
    if isinstance(error, CompactedError):
        fields.update(err="compacted", req=error.requested_revision, crev=error.compact_revision)
    elif isinstance(error, LeaseNotFoundError):
        fields["err"] = "lease_not_found"
    elif isinstance(error, LimitExceededError):
        fields["err"] = "limit"
    elif isinstance(error, BackendConnectionError):
        fields["err"] = "busy"
    elif isinstance(error, ValueTooLargeError):
        fields["err"] = "too_large"
    elif isinstance(error, BackendAuthError):
        fields["err"] = "auth"
    elif isinstance(error, ProtocolError):
        fields["err"] = "protocol"
    elif isinstance(error, ValueError):
        fields["err"] = "invalid"
    else:
        fields["err"] = "internal"
    return fields


def error_from_wire(header: dict[str, Any]) -> Exception:
    """The exception an error header describes: a BackendError, or ValueError for "invalid"."""
    code, message = header.get("err"), str(header.get("msg", "no message"))
    if code == "compacted":
        requested, compacted = header.get("req"), header.get("crev")
        return CompactedError(
            message,
            requested_revision=requested if isinstance(requested, int) else 0,
            compact_revision=compacted if isinstance(compacted, int) else 0,
        )
    simple: dict[Any, type[Exception]] = {
        "lease_not_found": LeaseNotFoundError,
        "too_large": ValueTooLargeError,
        "limit": LimitExceededError,
        "busy": BackendConnectionError,
        "auth": BackendAuthError,
        "protocol": ProtocolError,
        "version": ProtocolError,
        "invalid": ValueError,
    }
    kind = simple.get(code, BackendError)
    return kind(message if code in simple or code == "internal" else f"Server error {code!r}: {message}")
