"""Reading input a peer or a file controls: JSON that fails with one ``ValueError``, and short quotes.

``json.loads`` raises ``RecursionError`` (not ``ValueError``) on deeply nested input such as
``"[" * 50000``, and a caller that catches only ``ValueError`` then dies with a traceback.
:func:`parse_json` turns that, bad UTF-8 and oversized input into ``ValueError`` with a short
reason. :func:`quote` keeps an error message short whatever the bad value was, so a 1 MB
entry cannot become a 1 MB log line.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["QUOTE_LIMIT", "parse_json", "quote"]

QUOTE_LIMIT = 100
"""Characters of a bad value an error message quotes at most."""

_decode = json.JSONDecoder().decode


def parse_json(raw: bytes | bytearray | memoryview | str, *, max_bytes: int | None = None) -> Any:
    """Decode one JSON document from untrusted ``raw``.

    Raises:
        ValueError: ``raw`` is over ``max_bytes``, not UTF-8, not JSON, or nested too deeply
            to decode (the message is one short line).
    """
    if max_bytes is not None and len(raw) > max_bytes:
        raise ValueError(f"it is {len(raw)} bytes, over the {max_bytes}-byte limit")
    try:
        text = raw if isinstance(raw, str) else str(raw, "utf-8")
        return _decode(text)
    except RecursionError:
        raise ValueError("it is nested too deeply to decode") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"it is not JSON (not UTF-8 at byte {error.start})") from None
    except ValueError as error:  # JSONDecodeError
        raise ValueError(f"it is not JSON ({quote(error)})") from None


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` (``str`` for exceptions) cut to about ``limit`` characters, saying how long it was."""
    text = str(value) if isinstance(value, BaseException) else _safe_repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def _safe_repr(value: object) -> str:
    try:
        return repr(value)
    except RecursionError:  # a deeply nested list decoded from JSON
        return f"<{type(value).__name__} nested too deeply to show>"
