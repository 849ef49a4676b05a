"""Reading input a peer or a file controls: JSON and small files that fail with one ``ValueError``,
and short quotes.

``json.loads`` raises ``RecursionError`` (not ``ValueError``) on deeply nested input such as
``"[" * 50000``, and a caller that catches only ``ValueError`` then dies with a traceback.
:func:`parse_json` turns that, bad UTF-8 and oversized input into ``ValueError`` with a short
reason. :func:`read_small_file` reads a secret or certificate named by a flag: only a regular
file, only up to a bound, never blocking on a FIFO (``token_file=/dev/zero`` once ended in a
``MemoryError``, a FIFO in a hang). :func:`quote` keeps an error message short whatever the bad value was, so a 1 MB
entry cannot become a 1 MB log line.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

__all__ = ["QUOTE_LIMIT", "parse_json", "quote", "read_small_file"]

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


def read_small_file(path: str | os.PathLike[str], *, max_bytes: int) -> bytes:
    """The bytes of ``path`` (symbolic links followed, as mounted secrets use them), which must
    be a regular file of at most ``max_bytes``.

    It is opened non-blocking, so a FIFO with no writer cannot hang the caller, and checked
    with ``fstat`` on the open descriptor before a byte is read.

    Raises:
        ValueError: it cannot be opened or read (the reason, e.g. "No such file or directory"),
            is not a regular file (a directory, a FIFO, a device such as ``/dev/zero``), or
            holds more than ``max_bytes``; the message is one short line without the path.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as error:
        raise ValueError(error.strerror or str(error)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"it is {_file_kind(info.st_mode)}, not a regular file")
        if info.st_size > max_bytes:
            raise ValueError(f"it is {info.st_size} bytes, over the {max_bytes}-byte limit")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as error:
        raise ValueError(error.strerror or str(error)) from None
    finally:
        os.close(fd)
    if size > max_bytes:  # it grew while being read
        raise ValueError(f"it holds more than the {max_bytes}-byte limit")
    return b"".join(chunks)


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "a special file"


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
