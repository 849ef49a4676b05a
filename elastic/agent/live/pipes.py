"""One live worker's two pipes: rounds from the agent (``ELASTIC_ROUND_FD``), answers back
(``ELASTIC_READY_FD``).

Torch-free. The agent writes one line per round (:func:`elastic.worker.rounds.encode_round_line`),
and one after each renewal of its lease (:func:`elastic.worker.rounds.encode_held_line`),
and never blocks on it: a worker that stopped reading for a pipe's worth of rounds is one the
answer deadline restarts anyway. The answers (``joining``/``formed``/``lost``, see
:mod:`elastic.worker.reporting`) are read without blocking whenever the agent looks.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

from elastic.agent.processes.group_state import WorkerExtras
from elastic.worker.refill import REFILL_VAR
from elastic.worker.rounds import (
    READY_FD_VAR,
    ROUND_FD_VAR,
    ROUND_VAR,
    STORE_PREFIX_VAR,
    Held,
    Round,
    encode_held_line,
    encode_round_line,
)

log = logging.getLogger(__name__)

__all__ = ["Answer", "RoundPipes"]

_MAX_PENDING = 64 * 1024
"""Bytes of an unfinished answer line kept; a worker that writes more without a newline is garbage."""


@dataclass(frozen=True)
class Answer:
    """One line a worker wrote back: its event for a round."""

    event: str
    round: int
    step: int


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
        self._pending = b""
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

    def answers(self) -> list[Answer]:
        """The answers written since the last call (garbage lines are skipped)."""
        data = b""
        while not self._closed:
            try:
                chunk = os.read(self._ready_r, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
        lines = (self._pending + data).split(b"\n")
        self._pending = lines.pop()[-_MAX_PENDING:]
        return [answer for answer in map(_answer, lines) if answer is not None]

    def close(self) -> None:
        """Close every end still open (idempotent)."""
        self.started()
        if not self._closed:
            self._closed = True
            os.close(self._round_w)
            os.close(self._ready_r)


def _answer(line: bytes) -> Answer | None:
    try:
        value = json.loads(line)
        answer = Answer(str(value["event"]), value["round"], value["step"])
    except (ValueError, KeyError, TypeError):
        return None
    return answer if type(answer.round) is int and type(answer.step) is int else None
