"""The messages between the agent and a worker template: length-prefixed JSON, bounded.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON holding one object.
:func:`encode` builds a frame; :class:`FrameReader` cuts a byte stream back into objects and
refuses a frame longer than its bound before buffering it, so a peer cannot make the reader
hold more than one bounded frame, and refuses JSON nested deeper than :data:`MAX_NESTING` (a
``RecursionError`` from the decoder once killed the agent's reader thread). :class:`WorkerJob` is what a ``fork`` request carries;
:func:`fork_request` writes it and :func:`read_fork_request` reads it back, checked. Pure and
stdlib-only: the template imports this before the user's modules, and the tests feed it bytes.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["ENTRYPOINT_KINDS", "MAX_FRAME_BYTES", "MAX_NESTING", "FrameReader", "TemplateWireError", "WorkerJob", "encode",
           "fork_request", "read_fork_request"]

# Entrypoints a template can run; ``command`` (``--no-python``) starts as always.
ENTRYPOINT_KINDS = ("script", "module", "run_path")

# A worker's environment, argv and paths: a few kilobytes to tens of kilobytes in practice.
MAX_FRAME_BYTES = 1 << 20
# Our messages nest three deep ({"env": {...}}); anything far deeper is not ours.
MAX_NESTING = 32
_HEADER = struct.Struct(">I")


class TemplateWireError(ValueError):
    """A frame that cannot be sent or read: too large, not JSON, or not a JSON object."""


def encode(message: Mapping[str, Any], *, limit: int = MAX_FRAME_BYTES) -> bytes:
    """One frame holding ``message``.

    Raises:
        TemplateWireError: the message is not JSON-serialisable or its frame exceeds ``limit``.
    """
    try:
        body = json.dumps(message, separators=(",", ":")).encode()
    except (TypeError, ValueError) as error:
        raise TemplateWireError(f"The template message cannot be encoded: {error}") from error
    if len(body) > limit:
        raise TemplateWireError(f"The template message ({len(body)} bytes) exceeds {limit} bytes.")
    return _HEADER.pack(len(body)) + body


class FrameReader:
    """Cuts a byte stream into messages; holds at most one frame (``limit`` bytes) plus a header.

    Raises (from :meth:`feed`):
        TemplateWireError: a frame announces more than ``limit`` bytes, is not a JSON object,
            or nests deeper than :data:`MAX_NESTING`. The stream is then unusable: the caller drops the connection.
    """

    def __init__(self, limit: int = MAX_FRAME_BYTES) -> None:
        self._limit = limit
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """Add bytes; return the messages they complete, in order."""
        self._buffer += data
        messages = []
        while len(self._buffer) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(self._buffer)
            if length > self._limit:
                raise TemplateWireError(f"A template frame announces {length} bytes; the limit is {self._limit}.")
            end = _HEADER.size + length
            if len(self._buffer) < end:
                break
            body = bytes(self._buffer[_HEADER.size:end])
            del self._buffer[:end]
            try:
                message = json.loads(body)
            except RecursionError:
                raise TemplateWireError(f"A template frame is nested deeper than {MAX_NESTING} levels.") from None
            except (UnicodeDecodeError, ValueError) as error:
                raise TemplateWireError(f"A template frame is not JSON: {str(error)[:200]}") from error
            if not isinstance(message, dict):
                raise TemplateWireError(f"A template frame holds {type(message).__name__}, not an object.")
            if _nested_deeper(message, MAX_NESTING):
                raise TemplateWireError(f"A template frame is nested deeper than {MAX_NESTING} levels.")
            messages.append(message)
        return messages

    @property
    def pending(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buffer)


def _nested_deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` holds lists or objects more than ``limit`` deep (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


@dataclass(frozen=True)
class WorkerJob:
    """What a forked worker becomes: the entrypoint (``${local_rank}`` already substituted),
    its full environment, working directory and ``sys.path[0]``, and the environment variables
    that name a descriptor it inherits (live recovery's round pipes): those descriptors ride
    along after stdout and stderr, and the child sets each variable to its own number."""

    kind: str
    target: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    path0: str
    inherited: tuple[str, ...] = ()


def fork_request(job: WorkerJob, fds: int) -> dict[str, Any]:
    """The ``fork`` message for ``job``, whose stdout, stderr and inherited descriptors ride along
    as ``fds`` descriptors."""
    return {"op": "fork", "kind": job.kind, "target": job.target, "args": list(job.args), "env": dict(job.env),
            "cwd": job.cwd, "path0": job.path0, "fds": fds, "inherit": list(job.inherited)}


def read_fork_request(message: Mapping[str, Any]) -> WorkerJob:
    """The job a ``fork`` message asks for.

    Raises:
        TemplateWireError: a field is missing or of the wrong type, or the kind is unknown.
    """
    try:
        job = WorkerJob(kind=str(message["kind"]), target=str(message["target"]),
                        args=tuple(str(a) for a in message["args"]),
                        env={str(k): str(v) for k, v in dict(message["env"]).items()},
                        cwd=str(message["cwd"]), path0=str(message["path0"]),
                        inherited=tuple(str(name) for name in message.get("inherit", ())))
    except (KeyError, TypeError, ValueError) as error:
        raise TemplateWireError(f"A fork request is malformed: {error!r}") from error
    if job.kind not in ENTRYPOINT_KINDS:
        raise TemplateWireError(f"A fork request names the entrypoint kind {job.kind!r}.")
    return job
