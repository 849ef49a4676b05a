"""One live worker's two pipes: rounds from the agent (``ELASTIC_ROUND_FD``), answers back
(``ELASTIC_READY_FD``).

Torch-free. The agent writes one line per round (:func:`elastic.worker.rounds.encode_round_line`),
and one after each renewal of its lease (:func:`elastic.worker.rounds.encode_held_line`),
and never blocks on it: a worker that stopped reading for a pipe's worth of rounds is one the
answer deadline restarts anyway. The answers (:class:`~elastic.worker.rounds.Ready` lines,
:func:`elastic.worker.rounds.parse_ready_line`) are read without blocking whenever the agent
looks, a bounded amount at a time; a line that is not an answer (too long, too deep, not JSON,
not a known event) is skipped with one warning, as the template wire (:mod:`elastic.agent.prewarm.wire`) bounds its frames.
"""

from __future__ import annotations

import logging
import os

from elastic.agent.processes.group_state import WorkerExtras
from elastic.worker.errors import ReadyLineError
from elastic.worker.refill import REFILL_VAR
from elastic.worker.rounds import (
    MAX_READY_BYTES,
    READY_FD_VAR,
    ROUND_FD_VAR,
    ROUND_VAR,
    STORE_PREFIX_VAR,
    Held,
    Ready,
    Round,
    encode_held_line,
    encode_round_line,
    parse_ready_line,
)

log = logging.getLogger(__name__)

__all__ = ["MAX_ANSWER_BYTES", "MAX_READ_BYTES", "LineCutter", "RoundPipes"]

MAX_ANSWER_BYTES = MAX_READY_BYTES
"""The longest answer line read (a real one is under 100 bytes); a longer line is skipped unparsed."""
MAX_READ_BYTES = 1 << 20
"""Bytes read from one worker's answer pipe per look; what a flooding worker writes beyond waits
in the pipe (and blocks it), so the agent's memory and loop stay its own."""


class RoundPipes:
    """The pipes of one worker process, created before it starts.

    Raises (on construction):
        OSError: no descriptors left.
    """

    def __init__(self, label: str) -> None:
        self._label = label
        self._round_r, self._round_w = os.pipe()
        self._ready_r, self._ready_w = os.pipe()
        os.set_blocking(self._round_w, False)
        os.set_blocking(self._ready_r, False)
        self._child_ends: list[int] | None = [self._round_r, self._ready_w]
        self._lines = LineCutter(MAX_ANSWER_BYTES)
        self._warned = False
        self._closed = False
        self._held = 0.0  # the newest held line written

    def extras(self, first: Round, refill: bool = False) -> WorkerExtras:
        """What the worker is started with: the child ends, its first round's number and prefix,
        and (``refill``) that it replaces a worker of that round (:mod:`elastic.worker.refill`)."""
        env = {ROUND_VAR: str(first.round), STORE_PREFIX_VAR: first.store_prefix}
        if refill:
            env[REFILL_VAR] = "1"
        return WorkerExtras(env=env, fds={ROUND_FD_VAR: self._round_r, READY_FD_VAR: self._ready_w})

    def started(self) -> None:
        """Close the agent's copies of the child ends (the worker holds its own now): the worker
        then reads EOF when the agent dies, and the agent when the worker does."""
        ends, self._child_ends = self._child_ends, None
        for fd in ends or ():
            os.close(fd)

    def publish(self, round_: Round) -> bool:
        """Write ``round_``'s line; False when the worker is gone or its pipe is full."""
        return self._write(encode_round_line(round_), f"round {round_.round}")

    def publish_held(self, held: Held) -> bool:
        """Write ``held``'s line unless one as new was written; False when the worker is gone or
        its pipe is full."""
        if held.until <= self._held:
            return True
        self._held = held.until
        return self._write(encode_held_line(held), "the lease's renewal")

    def _write(self, line: bytes, what: str) -> bool:
        if self._closed:
            return False
        try:
            written = os.write(self._round_w, line)
        except BlockingIOError:
            written = 0
        except OSError:  # EPIPE: the worker exited
            return False
        if written != len(line):  # a pipe takes a line under PIPE_BUF whole or not at all
            log.warning("%s: the round pipe is full; %s not published", self._label, what)
            return False
        return True

    def answers(self) -> list[Ready]:
        """The answers written since the last call, reading at most :data:`MAX_READ_BYTES`.

        A line that is not an answer (not JSON, nested too deeply, longer than
        :data:`MAX_ANSWER_BYTES`, not a :class:`~elastic.worker.rounds.Ready`) is skipped, with one warning per worker: a worker can make the
        agent hold no more than one answer's bytes between calls, and cannot make it raise.
        """
        chunks: list[bytes] = []
        size = 0
        while not self._closed and size < MAX_READ_BYTES:
            try:
                chunk = os.read(self._ready_r, min(65536, MAX_READ_BYTES - size))
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        answers, skipped = [], []
        for line in self._lines.feed(b"".join(chunks)):
            answer = _answer(line) if line is not None else None
            if answer is not None:
                answers.append(answer)
            else:
                skipped.append(f"over {MAX_ANSWER_BYTES} bytes" if line is None else repr(line[:100]))
        if skipped and not self._warned:
            self._warned = True
            log.warning("%s: skipped a line on the ready pipe that is not an answer (%s); further ones are "
                        "skipped silently", self._label, skipped[0])
        return answers

    def close(self) -> None:
        """Close every end still open (idempotent)."""
        self.started()
        if not self._closed:
            self._closed = True
            os.close(self._round_w)
            os.close(self._ready_r)


class LineCutter:
    """Cuts a byte stream into lines of at most ``limit`` bytes, holding at most ``limit`` bytes
    between feeds: a longer line is dropped as it arrives, up to its newline, and reported once
    as ``None``. Pure (no I/O)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._pending = b""
        self._skipping = False

    def feed(self, data: bytes) -> list[bytes | None]:
        """The lines completed by ``data`` (without their newline); ``None`` for each over-long one."""
        *lines, tail = data.split(b"\n")
        out: list[bytes | None] = []
        for index, line in enumerate(lines):
            if index == 0:
                line, self._pending = self._pending + line, b""
                if self._skipping:  # the end of a line already reported
                    self._skipping = False
                    continue
            out.append(line if len(line) <= self._limit else None)
        if not self._skipping:
            self._pending += tail
            if len(self._pending) > self._limit:
                self._pending, self._skipping = b"", True
                out.append(None)
        return out


def _answer(line: bytes) -> Ready | None:
    try:
        return parse_ready_line(line)
    except ReadyLineError:
        return None
