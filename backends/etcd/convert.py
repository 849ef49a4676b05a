"""Convert between our contract types and etcd's protobuf messages (keys: UTF-8 ``str`` <-> bytes)."""

from __future__ import annotations

from typing import Any

from etcd3.etcdrpc import kv_pb2

from backends.api import EventType, KeyValue, WatchEvent

_ALL_KEYS = b"\0"


def encode_key(key: str) -> bytes:
    """A key as etcd stores it; ``surrogateescape`` round-trips keys that are not valid UTF-8."""
    return key.encode("utf-8", "surrogateescape")


def decode_key(raw: bytes) -> str:
    """Inverse of :func:`encode_key`."""
    return raw.decode("utf-8", "surrogateescape")


def prefix_range_end(prefix: bytes) -> bytes:
    """The ``range_end`` that selects every key starting with ``prefix`` (all keys for ``b""``)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return _ALL_KEYS


def key_value(message: Any) -> KeyValue:
    """A :class:`KeyValue` from an ``mvccpb.KeyValue``."""
    return KeyValue(
        key=decode_key(message.key),
        value=bytes(message.value),
        create_revision=message.create_revision,
        mod_revision=message.mod_revision,
        version=message.version,
        lease=message.lease,
    )


def first_key_value(messages: Any) -> KeyValue | None:
    """The first of a repeated ``kvs`` field as a :class:`KeyValue`, or None when empty."""
    return key_value(messages[0]) if len(messages) else None


def watch_event(message: Any) -> WatchEvent:
    """A :class:`WatchEvent` from an ``mvccpb.Event``; DELETE events carry the deletion revision."""
    if message.type == kv_pb2.Event.DELETE:
        kv = KeyValue(
            key=decode_key(message.kv.key),
            value=b"",
            create_revision=0,
            mod_revision=message.kv.mod_revision,
            version=0,
            lease=0,
        )
        return WatchEvent(EventType.DELETE, kv)
    return WatchEvent(EventType.PUT, key_value(message.kv))
