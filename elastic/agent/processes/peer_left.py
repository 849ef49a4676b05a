"""Keep a worker's traceback that only says a peer left off the console; the user's own stay.

When a node dies, every survivor's collective fails at once (gloo: ``Connection closed by
peer``; NCCL: ``remote process exited``), and each rank prints a traceback long before the
agent sees the lost member; Ctrl-C, which the agent forwards, makes each rank print a
``KeyboardInterrupt`` traceback. Neither says anything the agent's own line (``member lost:
...``, ``received SIGINT``) does not. So a worker's stderr reaches the console through a
:class:`TracebackGate`: ordinary output passes at once, a traceback is held until it is complete
and then either shown or withheld, and what is withheld goes to the rank's ``stderr.log`` only.

What is withheld (:func:`only_peer_left`): a block whose every exception is

* ``KeyboardInterrupt``, or
* an error of ``torch.distributed`` (gloo's ``RuntimeError``, whose message names a gloo source
  file; ``torch.distributed.DistBackendError``, ``DistNetworkError``, ``DistStoreError``,
  ``DistError``) or of ``elastic.worker`` (``CollectiveFailed``) whose message says the
  connection to a peer ended: ``Connection closed by peer``, ``Connection reset by peer``,
  ``Broken pipe``, ``remote process exited``, ``ncclRemoteError``, ``failed to recv, got 0 bytes``.

Everything else stays on the console: the user's ``ZeroDivisionError``, a
``ConnectionResetError`` of their own download, a collective that timed out (a hang is not a
peer that left), and a block with any such exception beside the peer's. The text alone decides:
the traceback is printed before the agent knows that a member was lost, and holding every
traceback until it does would hold the user's too.

A block starts at a line ``Traceback (most recent call last):`` or ``Exception in thread ...``
(after torch's ``[rankN]:`` prefix, if any) and ends when the worker's stderr is quiet for
:data:`QUIET_S`, at its end, after :data:`MAX_HOLD_S`, or at :data:`MAX_HELD_BYTES` (then it is
shown): memory and delay stay bounded, and a block cut short is shown, never lost.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import IO, Callable

from elastic.agent.private_files import open_private_file

log = logging.getLogger(__name__)

__all__ = ["MAX_HELD_BYTES", "MAX_HOLD_S", "QUIET_S", "Release", "TracebackGate", "WithheldLog", "only_peer_left"]

QUIET_S = 0.5
"""Seconds of silence after which a held block is complete (Python writes a traceback at once)."""

MAX_HOLD_S = 3.0
"""A block is decided at the latest this long after it began, even if the worker keeps writing."""

MAX_HELD_BYTES = 256 * 1024
"""A block longer than this is shown as it is (no traceback of a peer that left is this long)."""

_HEADERS = (b"Traceback (most recent call last):", b"Exception in thread ")
_RANK_PREFIX = re.compile(rb"\[rank\d+\]: ?")  # torch's excepthook after init_process_group
_RANK_PREFIX_TEXT = re.compile(r"\[rank\d+\]: ?")
_PARTIAL_RANK_PREFIX = re.compile(rb"\[(r(a(n(k\d*(\]:?)?)?)?)?)?")

_TORCH_ERRORS = frozenset({
    "torch.distributed.DistBackendError", "torch.distributed.DistNetworkError", "torch.distributed.DistStoreError",
    "torch.distributed.DistError", "elastic.worker.errors.CollectiveFailed",
})
_PEER_PHRASES = (
    "connection closed by peer", "connection reset by peer", "broken pipe", "remote process exited",
    "ncclremoteerror", "failed to recv, got 0 bytes",
)
_EXCEPTION_LINE = re.compile(r"([A-Za-z_][\w.]*)(?::\s?(.*))?")


# -- the decision ------------------------------------------------------------------------------
def only_peer_left(block: str) -> bool:
    """Whether ``block`` (one or more tracebacks, chained or not, as a worker printed them) holds
    exceptions and every one of them only says that a peer left (see the module docstring)."""
    exceptions = _exceptions(block)
    return bool(exceptions) and all(_peer_left(kind, message) for kind, message in exceptions)


def _exceptions(block: str) -> list[tuple[str, str]]:
    """``(type, message)`` of the exception line that ends each traceback of ``block``."""
    found: list[tuple[str, str]] = []
    in_frames = False
    for raw in block.splitlines():
        prefix = _RANK_PREFIX_TEXT.match(raw)
        line = raw[prefix.end():] if prefix else raw
        if line.startswith("Traceback (most recent call last):"):
            in_frames = True
        elif in_frames and line and not line[0].isspace():
            in_frames = False
            match = _EXCEPTION_LINE.fullmatch(line)
            found.append((match[1], match[2] or "") if match else (line, ""))
    return found


def _peer_left(kind: str, message: str) -> bool:
    if kind == "KeyboardInterrupt":
        return True
    text = message.lower()
    from_torch = kind in _TORCH_ERRORS or (kind == "RuntimeError" and "gloo/" in text)
    return from_torch and any(phrase in text for phrase in _PEER_PHRASES)


# -- the stream --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Release:
    """What one step of the gate lets go: bytes for the console, bytes withheld from it."""

    shown: bytes = b""
    withheld: bytes = b""

    def __add__(self, other: Release) -> Release:
        return Release(self.shown + other.shown, self.withheld + other.withheld)


class TracebackGate:
    """Cuts one worker's stderr into what the console shows and what it withholds; not thread-safe
    (one pump feeds it). ``decide`` judges a held block (default :func:`only_peer_left`);
    ``clock`` is monotonic seconds."""

    def __init__(self, decide: Callable[[str], bool] = only_peer_left,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._decide = decide
        self._clock = clock
        self._line = b""  # the start of the current line, held: it may begin a block
        self._mid_line = False  # part of the current line was shown: it cannot begin a block
        self._held: bytearray | None = None
        self._began = 0.0
        self._last = 0.0
        self.last_withheld = False
        """Whether the last block let go was withheld: the worker's last traceback only said a peer left."""

    @property
    def holding(self) -> bool:
        return self._held is not None or bool(self._line)

    def feed(self, data: bytes) -> Release:
        """Take the next bytes of the stream; what can be let go now."""
        now = self._clock()
        self._last = now
        if self._held is not None:
            self._held += data
            return self._release() if len(self._held) > MAX_HELD_BYTES else Release()
        return self._pass(data, now)

    def tick(self) -> Release:
        """Let a block go once it is complete (quiet) or held too long; a held line start too."""
        now = self._clock()
        if self._held is not None:
            if now - self._last >= QUIET_S or now - self._began >= MAX_HOLD_S:
                return self._release()
        elif self._line and now - self._last >= QUIET_S:
            shown, self._line, self._mid_line = self._line, b"", True
            return Release(shown=shown)
        return Release()

    def end(self) -> Release:
        """The stream ended: let everything go."""
        if self._held is not None:
            return self._release()
        shown, self._line = self._line, b""
        return Release(shown=shown)

    def _pass(self, data: bytes, now: float) -> Release:
        shown = bytearray()
        data = self._line + data
        self._line = b""
        start = 0
        if not any(header in data for header in _HEADERS):  # the common case: only the last line may begin one
            start = data.rfind(b"\n") + 1
            shown += data[:start]
            self._mid_line = self._mid_line and start == 0
        while start < len(data):
            end = data.find(b"\n", start)
            line = data[start:] if end < 0 else data[start:end + 1]
            if not self._mid_line and _begins_block(line):
                self._held, self._began = bytearray(data[start:]), now
                return Release(shown=bytes(shown)) + (self._release() if len(self._held) > MAX_HELD_BYTES
                                                      else Release())
            if end < 0:
                if not self._mid_line and _may_begin_block(line):
                    self._line = line  # wait for the rest of the line
                else:
                    shown += line
                    self._mid_line = True
                break
            shown += line
            self._mid_line = False
            start = end + 1
        return Release(shown=bytes(shown))

    def _release(self) -> Release:
        block, self._held = bytes(self._held or b""), None
        self._mid_line = not block.endswith(b"\n")
        self.last_withheld = self._decide(block.decode("utf-8", errors="replace"))
        return Release(withheld=block) if self.last_withheld else Release(shown=block)


def _strip_rank(line: bytes) -> bytes:
    """``line`` without torch's ``[rankN]: `` prefix."""
    match = _RANK_PREFIX.match(line)
    return line[match.end():] if match else line


def _begins_block(line: bytes) -> bool:
    """Whether a whole line (or a line start long enough to tell) begins a block."""
    text = _strip_rank(line)
    return any(text.startswith(header) for header in _HEADERS)


def _may_begin_block(start: bytes) -> bool:
    """Whether an unfinished line could still turn into a block's first line."""
    if _PARTIAL_RANK_PREFIX.fullmatch(start):
        return True
    text = _strip_rank(start)
    return any(header.startswith(text) for header in _HEADERS)


class WithheldLog:
    """Where one worker's withheld blocks go: appended to ``path`` (opened on the first), unless
    ``already_there`` (a tee'd stream: its log file has every byte); each noted in one INFO line
    (``-v``) naming ``who`` (``Run R attempt K local rank L``) and the file. A block that cannot
    be written is handed back to the console rather than lost."""

    def __init__(self, path: str, who: str, *, already_there: bool = False) -> None:
        self.path = path
        self._who = who
        self._already_there = already_there
        self._file: IO[bytes] | None = None

    def __call__(self, block: bytes) -> bool:
        """Keep ``block``; False when it could not be written (then the console must show it)."""
        if not self._already_there:
            try:
                if self._file is None:
                    self._file = open_private_file(self.path, "ab", buffering=0)
                self._file.write(block)
            except OSError as error:
                log.info("%s: cannot write %s (%s); its traceback goes to the console", self._who, self.path,
                         error.strerror or error)
                return False
        log.info("%s: its traceback says only that a peer left (or Ctrl-C); kept off the console, in %s",
                 self._who, self.path)
        return True

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
