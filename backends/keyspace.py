"""The live keys of a :class:`~backends.kvstate.KVState`, in key order, and the bytes they hold, bounded.

Passive like the state that owns it (no I/O, no threads, not thread-safe). It checks writes
against its bounds (key and value sizes, the live bytes of all keys) but decides nothing else:
revisions, versions and leases are the state's.
"""

from __future__ import annotations

import bisect
from typing import Iterator

from backends.api import KeyValue
from backends.errors import LimitExceededError, ValueTooLargeError
from backends.untrusted import quote

__all__ = ["KEY_OVERHEAD_BYTES", "KeySpace"]

KEY_OVERHEAD_BYTES = 200
"""What one live key costs beyond its key and value, for the live-bytes bound (so a flood of
empty keys is bounded too)."""


class KeySpace:
    """Key → :class:`~backends.api.KeyValue`, with the keys kept sorted for prefix reads.

    Args:
        max_key_bytes: longest key (UTF-8 bytes) :meth:`check_value` accepts.
        max_value_bytes: largest value :meth:`check_value` accepts.
        max_live_bytes: live bytes (see :attr:`live_bytes`) :meth:`check_live_bytes` allows.
    """

    def __init__(self, max_key_bytes: int, max_value_bytes: int, max_live_bytes: int) -> None:
        self.max_key_bytes = max_key_bytes
        self.max_value_bytes = max_value_bytes
        self.max_live_bytes = max_live_bytes
        self._live_bytes = 0
        self._kvs: dict[str, KeyValue] = {}
        self._sorted_keys: list[str] = []

    @property
    def live_bytes(self) -> int:
        """Bytes of live keys and values, plus :data:`KEY_OVERHEAD_BYTES` per key."""
        return self._live_bytes

    def __contains__(self, key: str) -> bool:
        return key in self._kvs

    def get(self, key: str) -> KeyValue | None:
        return self._kvs.get(key)

    def keys_under(self, prefix: str) -> Iterator[str]:
        """The keys starting with ``prefix``, in key (code point = UTF-8 byte) order."""
        keys = self._sorted_keys
        index = bisect.bisect_left(keys, prefix)
        while index < len(keys) and keys[index].startswith(prefix):
            yield keys[index]
            index += 1

    def kvs_under(self, prefix: str) -> tuple[KeyValue, ...]:
        """The key-values under ``prefix``, in key order."""
        return tuple(self._kvs[key] for key in self.keys_under(prefix))

    def count_prefix(self, prefix: str) -> int:
        """How many keys start with ``prefix`` (two bisections of the sorted keys)."""
        keys = self._sorted_keys
        start = bisect.bisect_left(keys, prefix)
        if not prefix:
            return len(keys) - start
        return bisect.bisect_left(keys, prefix[:-1] + chr(ord(prefix[-1]) + 1), start) - start

    def check_value(self, key: str, value: bytes) -> None:
        """Raises ValueTooLargeError when ``key`` or ``value`` is over its size bound."""
        # A character is at most 4 UTF-8 bytes, so short keys (all of them, in practice) skip the encode.
        if len(key) * 4 > self.max_key_bytes and len(key.encode("utf-8", "surrogatepass")) > self.max_key_bytes:
            raise ValueTooLargeError(
                f"The key {quote(key)} is {len(key.encode('utf-8', 'surrogatepass'))} bytes; the store accepts "
                f"keys of at most {self.max_key_bytes} bytes."
            )
        if len(value) > self.max_value_bytes:
            raise ValueTooLargeError(
                f"The value for {quote(key)} is {len(value)} bytes; the store accepts at most {self.max_value_bytes}."
            )

    def check_live_bytes(self, sizes: dict[str, int]) -> None:
        """Refuse writes of ``{key: value length}`` that would pass :attr:`max_live_bytes`.

        Raises:
            LimitExceededError: naming the bound and what the writes would bring it to.
        """
        added = sum(_live_size(key, size) - (_live_size(key, len(old.value)) if (old := self._kvs.get(key)) else 0)
                    for key, size in sizes.items())
        if added > 0 and self._live_bytes + added > self.max_live_bytes:
            raise LimitExceededError(
                f"The store holds {self._live_bytes} bytes of keys and values; this write would bring it to "
                f"{self._live_bytes + added}, over its limit of {self.max_live_bytes} (--max-live-bytes). Delete "
                "keys no longer used, or raise the limit."
            )

    def put(self, kv: KeyValue) -> None:
        """Store ``kv`` under its key, replacing what was there (checked by the caller)."""
        old = self._kvs.get(kv.key)
        if old is None:
            bisect.insort(self._sorted_keys, kv.key)
        else:
            self._live_bytes -= _live_size(kv.key, len(old.value))
        self._live_bytes += _live_size(kv.key, len(kv.value))
        self._kvs[kv.key] = kv

    def pop(self, key: str) -> KeyValue:
        """Remove ``key`` and return what it held.

        Raises:
            KeyError: ``key`` is not live.
        """
        old = self._kvs.pop(key)
        del self._sorted_keys[bisect.bisect_left(self._sorted_keys, key)]
        self._live_bytes -= _live_size(key, len(old.value))
        return old


def _live_size(key: str, value_bytes: int) -> int:
    """What one live key counts against the live-bytes bound (keys are counted in characters)."""
    return len(key) + value_bytes + KEY_OVERHEAD_BYTES
