"""Where each worker's stdout and stderr go, as torchrun's ``--redirects``/``--tee``/``--local-ranks-filter``.

==============  =====================================  ============================================
mask            shown rank                             filtered-out rank
==============  =====================================  ============================================
neither         the agent's console, as is (stdout      discarded
                inherited, stderr gated: below)
redirect        ``<rank dir>/{stdout,stderr}.log``      the file
tee             the file, and the console with each     the file
                line prefixed ``[{role}{local_rank}]:``
==============  =====================================  ============================================

Logs live in ``<log_root>/<run_id>/<node_id>/attempt_<k>/<local_rank>/`` with the worker's
``error.json`` (its ``TORCHELASTIC_ERROR_FILE``), unless a ``--logs-specs`` plugin places them:
then each stream goes where its :class:`RankDest` says (a file, the console or nowhere, tee'd or
not; :func:`route_dest`). Every stream that lands in a log file is pumped by one thread (pipe →
file, and for a tee the console, line-buffered, bounded memory), as is a console that is only a
Python stream; the others are plain file descriptors. The agent, never the worker, writes the
log files: a full disk costs log lines, not the worker (:mod:`elastic.agent.processes.log_loss`).
:func:`route_stream` decides, :class:`WorkerOutput` carries it out for one worker.

A worker's stderr that reaches the console is *gated*: piped through a
:class:`~elastic.agent.processes.peer_left.TracebackGate`, which keeps a traceback that only says
a peer left (or Ctrl-C) off the console and in the rank's ``stderr.log`` (the whole stream with
``--tee``; by default, only what was withheld). The rest passes at once, unprefixed and unbuffered
when not tee'd. Only where there is such a file: a plugin's console stream is not gated.
"""

from __future__ import annotations

import contextlib
import errno
import enum
import io
import logging
import os
import select
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from string import Template
from typing import IO

from elastic.agent.private_files import open_private_file
from elastic.agent.processes.log_loss import DISK_FULL, REPORTER, LogLossReporter
from elastic.agent.processes.peer_left import Release, TracebackGate, WithheldLog

log = logging.getLogger(__name__)

__all__ = [
    "Console",
    "MAX_LINE_BYTES",
    "PUMP_DRAIN_S",
    "RankDest",
    "Sink",
    "StreamRoute",
    "WorkerLogs",
    "WorkerOutput",
    "attempt_log_dir",
    "console_prefix",
    "resolve_log_root",
    "route_dest",
    "route_stream",
]

# How long a pump keeps draining its pipe after stop() once no worker holds it.
PUMP_DRAIN_S = 1.0
# A console line longer than this is emitted in pieces rather than buffered further.
MAX_LINE_BYTES = 64 * 1024
_POLL_S = 0.05
STREAMS = ("stdout", "stderr")

_console_lock = threading.Lock()
_default_log_root: str | None = None
_default_log_root_lock = threading.Lock()


@dataclass(frozen=True)
class WorkerLogs:
    """Where one worker's output went: file paths, ``None`` for a stream not written to a file."""

    stdout: str | None
    stderr: str | None
    error_file: str


def resolve_log_root(log_dir: str | None) -> str:
    """``--log-dir``, or else one temporary directory per agent process (as torchrun), created
    on first use and shared by every attempt."""
    global _default_log_root
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        return log_dir
    with _default_log_root_lock:
        if _default_log_root is None or not os.path.isdir(_default_log_root):
            _default_log_root = tempfile.mkdtemp(prefix="elasticrun_")
        return _default_log_root


def attempt_log_dir(log_root: str, run_id: str, attempt: int, node_id: str | None = None) -> str:
    """``<log_root>/<run_id>/<node_id>/attempt_<attempt>``: one directory per node, so agents
    may share ``--log-dir`` (a shared volume); a ``/`` in an id becomes ``_``.

    Raises:
        ValueError: the ids would lead outside ``log_root`` (``.``, ``..``): the agent deletes
            an attempt's directory before reusing it, and must never delete anything else.
    """
    parts = [part.replace(os.sep, "_") or "run" for part in (run_id, node_id) if part is not None]
    for part in parts:
        if not part.strip("."):
            raise ValueError(f"The log directory name {part!r} must be a plain name, not only dots.")
    path = os.path.join(log_root, *parts, f"attempt_{attempt}")
    root = os.path.realpath(log_root)
    if os.path.commonpath([root, os.path.realpath(path)]) != root:
        raise ValueError(f"The log directory {path!r} is outside the log root {log_root!r}.")
    return path


def console_prefix(template: str | None, role: str, rank: int, local_rank: int) -> str:
    """The console prefix of a tee'd line: ``[default0]:``, or torchrun's
    ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` with ``${role_name}``, ``${rank}`` (global) and
    ``${local_rank}`` substituted as torch does it (``string.Template.safe_substitute``: other
    names and a malformed ``$`` stay as written; an empty template counts as unset)."""
    if not template:
        return f"[{role}{local_rank}]:"
    return Template(template).safe_substitute(role_name=role, rank=rank, local_rank=local_rank)


# -- the decision ------------------------------------------------------------------------------
class Console(enum.Enum):
    """What the agent's console stream is: a file descriptor a child can inherit, a Python
    stream only (e.g. a ``StringIO``: a pump must copy into it), or absent (``None``)."""

    FD = "fd"
    STREAM = "stream"
    NONE = "none"


class Sink(enum.Enum):
    """Where the child's stream is connected."""

    INHERIT = "inherit"  # the console's file descriptor
    DEVNULL = "devnull"
    FILE = "file"  # the log file alone: a pump thread copies it there (a full disk never reaches the child)
    PIPE = "pipe"  # a pump thread copies it to the log file and/or the console


@dataclass(frozen=True)
class StreamRoute:
    """One stream's route: its sink, whether it lands in the log file, whether console lines
    get the rank prefix (tee'd streams only), and whether it is gated (see the module)."""

    sink: Sink
    logged: bool = False
    prefixed: bool = False
    gated: bool = False


def route_stream(*, redirect: bool, tee: bool, shown: bool, console: Console, gated: bool = False) -> StreamRoute:
    """The route of one worker stream (see the module's table). ``shown``: the rank passes
    ``--local-ranks-filter``. Without a console, a tee'd stream still lands in its file.
    ``gated``: the stream's tracebacks are judged on their way to the console (stderr), so it
    is piped even where it could be inherited."""
    if tee and shown and console is not Console.NONE:
        return StreamRoute(Sink.PIPE, logged=True, prefixed=True, gated=gated)
    if tee or redirect:
        return StreamRoute(Sink.FILE, logged=True)
    if not shown or console is Console.NONE:
        return StreamRoute(Sink.DEVNULL)
    if gated:
        return StreamRoute(Sink.PIPE, gated=True)
    return StreamRoute(Sink.INHERIT if console is Console.FD else Sink.PIPE)


@dataclass(frozen=True)
class RankDest:
    """Where one worker's output goes when a torch ``LogsSpecs`` plugin decides (its ``LogsDest``
    for one local rank): each stream's path, ``""`` for the console or ``os.devnull`` for nowhere;
    whether that file is also shown on the console (tee); the error file (``""``: none)."""

    stdout: str
    stderr: str
    tee_stdout: bool = False
    tee_stderr: bool = False
    error_file: str = ""


def route_dest(path: str, tee: bool, console: Console, *, gated: bool = False) -> StreamRoute:
    """The route of one stream a plugin placed at ``path``: as a redirect (``tee``: and shown) to
    that file, torch's console (``""``) as a stream nobody redirected, ``os.devnull`` discarded.
    A tee of a stream that goes to the console is that console, as under torch. ``gated`` holds
    for a tee'd stream only: the plugin's file is then where withheld blocks are."""
    if path == os.devnull:
        return StreamRoute(Sink.DEVNULL)
    teed = tee and bool(path)
    return route_stream(redirect=bool(path), tee=teed, shown=True, console=console, gated=gated and teed)


def console_kind(stream: IO | None) -> Console:
    """Classify the agent's console stream for :func:`route_stream`."""
    if stream is None:
        return Console.NONE
    return Console.STREAM if _fileno(stream) is None else Console.FD


# -- carrying it out ---------------------------------------------------------------------------
class WorkerOutput:
    """One worker's two streams: their routes and files, the child's ends, and the pumps.

    Args:
        routes: each stream's route (``{"stdout": ..., "stderr": ...}``).
        logs: the files (a logged route's stream is written to its path).
        consoles: the agent's console per stream (may be ``None``).
        withheld_path: where a gated stream that is not logged keeps what it withholds (None:
            such a stream is not gated).
        create_dirs: the pumps create a log file's directory when it is missing (our layout: a
            full disk may have refused it when the group started).

    Build it with :meth:`planned` (our layout) or :meth:`from_dest` (a plugin's).
    """

    def __init__(self, routes: dict[str, StreamRoute], logs: WorkerLogs, consoles: dict[str, IO | None],
                 withheld_path: str | None = None, *, create_dirs: bool = False) -> None:
        self.routes = routes
        self.logs = logs
        self._consoles = consoles
        self._create_dirs = create_dirs
        self.pumps: list[Pump] = []
        self.withheld_path = withheld_path

    @classmethod
    def planned(cls, rank_dir: str, *, redirect: dict[str, bool], tee: dict[str, bool], shown: bool,
                consoles: dict[str, IO | None]) -> WorkerOutput:
        """Our layout: ``rank_dir`` (``.../attempt_<k>/<local_rank>``) holds ``{stdout,stderr}.log``
        and ``error.json``; ``redirect``/``tee`` per stream from the masks; ``shown``: the rank
        passes ``--local-ranks-filter``."""
        routes = {
            name: route_stream(redirect=redirect[name], tee=tee[name], shown=shown,
                               console=console_kind(consoles[name]), gated=name == "stderr")
            for name in STREAMS
        }
        paths = {name: os.path.join(rank_dir, f"{name}.log") if routes[name].logged else None for name in STREAMS}
        return cls(routes, WorkerLogs(stdout=paths["stdout"], stderr=paths["stderr"],
                                      error_file=os.path.join(rank_dir, "error.json")), consoles,
                   withheld_path=os.path.join(rank_dir, "stderr.log"), create_dirs=True)

    @classmethod
    def from_dest(cls, dest: RankDest, consoles: dict[str, IO | None]) -> WorkerOutput:
        """A ``--logs-specs`` plugin's layout for one rank (:func:`route_dest` per stream)."""
        paths = {"stdout": (dest.stdout, dest.tee_stdout), "stderr": (dest.stderr, dest.tee_stderr)}
        routes = {name: route_dest(path, tee, console_kind(consoles[name]), gated=name == "stderr")
                  for name, (path, tee) in paths.items()}
        logged = {name: paths[name][0] if routes[name].logged else None for name in STREAMS}
        return cls(routes, WorkerLogs(stdout=logged["stdout"], stderr=logged["stderr"], error_file=dest.error_file),
                   consoles)

    @contextlib.contextmanager
    def stdio(self) -> Iterator[dict[str, object]]:
        """Popen's ``stdout``/``stderr`` for the child: the console's descriptor, ``DEVNULL`` or
        ``PIPE`` (for a pump)."""
        std: dict[str, object] = {}
        for name in STREAMS:
            sink = self.routes[name].sink
            if sink is Sink.INHERIT:
                std[name] = _fileno(self._consoles[name])
            else:
                std[name] = subprocess.DEVNULL if sink is Sink.DEVNULL else subprocess.PIPE
        yield std

    def start_pumps(self, proc: subprocess.Popen, prefix: str, local_rank: int, who: str = "") -> None:
        """Start a pump for each piped stream of ``proc`` (a file-only stream: no console copy);
        ``who`` names the worker in log lines (``Run R attempt K local rank L``)."""
        for name in STREAMS:
            route = self.routes[name]
            if route.sink not in (Sink.PIPE, Sink.FILE):
                continue
            pipe = getattr(proc, name)
            fd = os.dup(pipe.fileno())
            pipe.close()
            path = getattr(self.logs, name) if route.logged else None
            withheld = self._withheld(route, path, who or f"local rank {local_rank}")
            console = self._consoles[name] if route.sink is Sink.PIPE else None
            pump = Pump(f"pump-{name}-{local_rank}", fd, path, console, prefix if route.prefixed else "",
                        withheld=withheld, create_dir=self._create_dirs)
            pump.start()
            self.pumps.append(pump)

    def peer_left_at_end(self, timeout: float) -> str | None:
        """The file holding the traceback that ended this worker's stderr, when the console
        withheld it (it only said a peer left); else None. Waits up to ``timeout`` for the end."""
        for pump in self.pumps:
            if pump.gated:
                pump.join(timeout)
                return pump.withheld_path if not pump.is_alive() and pump.last_withheld else None
        return None

    def _withheld(self, route: StreamRoute, path: str | None, who: str) -> WithheldLog | None:
        """Where a gated stream's withheld blocks go: its log file, else the rank's ``stderr.log``."""
        kept_in = path or self.withheld_path
        if not route.gated or kept_in is None:
            return None
        return WithheldLog(kept_in, who, already_there=path is not None)


class Pump(threading.Thread):
    """Copies a worker's pipe to its log file and, line by line with a prefix, to the console
    (``None``: none); with ``withheld``, through a :class:`TracebackGate` that hands it what the
    console must not show."""

    def __init__(self, name: str, fd: int, path: str | None, console: IO | None, prefix: str,
                 withheld: WithheldLog | None = None, reporter: LogLossReporter = REPORTER, *,
                 create_dir: bool = False) -> None:
        super().__init__(name=name, daemon=True)
        self._fd = fd
        self._path = path or ""  # "": no log file
        self._create_dir = create_dir
        self._file: IO | None = None
        if path:
            try:
                self._file = _create_log(path, create_dir)
            except OSError as error:
                if error.errno not in DISK_FULL:
                    raise  # the file is refused (a symbolic link...): the worker's start fails
                # no room for it yet: the first chunk tries again
        self._console = console
        self._prefix = prefix.encode()
        self._partial = b""
        self._stop_at: float | None = None
        self._withheld = withheld
        self._gate = TracebackGate() if withheld is not None else None
        self._line_open = False  # an unprefixed console line was begun and not ended
        self._reporter = reporter
        self._lost = 0  # bytes the file misses since the last write that succeeded
        self._lost_reason = ""
        self._line_start = True  # the file ends with a whole line

    @property
    def gated(self) -> bool:
        return self._gate is not None

    @property
    def last_withheld(self) -> bool:
        """Whether the last traceback the gate let go was withheld."""
        return self._gate is not None and self._gate.last_withheld

    @property
    def withheld_path(self) -> str | None:
        return self._withheld.path if self._withheld is not None else None

    def request_stop(self, drain_s: float = PUMP_DRAIN_S) -> None:
        """Finish at EOF, or ``drain_s`` from now at the latest."""
        self._stop_at = time.monotonic() + drain_s

    def run(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        try:
            while True:
                if self._stop_at is not None and time.monotonic() >= self._stop_at:
                    break  # a process that escaped the stop still holds the pipe
                if not poller.poll(int(_POLL_S * 1000)):
                    if self._gate is not None and self._gate.holding:
                        self._release(self._gate.tick())
                    continue
                chunk = os.read(self._fd, 65536)
                if not chunk:
                    break
                if self._path:
                    self._to_file(chunk)
                if self._gate is not None:
                    self._release(self._gate.feed(chunk))
                elif self._console is not None:
                    self._to_console(chunk)
        except OSError:
            log.exception("Log pump %s failed; its output is lost from now on.", self.name)
        finally:
            if self._gate is not None:
                self._release(self._gate.end())
            if self._partial or self._line_open:  # end the last line: the next one is the agent's
                self._emit([self._partial + b"\n"])
            os.close(self._fd)
            if self._file is not None:
                with contextlib.suppress(OSError):  # a network filesystem may report a full disk here
                    self._file.close()
            if self._withheld is not None:
                self._withheld.close()

    def _to_file(self, chunk: bytes) -> None:
        """Append ``chunk`` to the log file. What a failed write (a full disk) could not write is
        dropped and reported; the next chunk tries again, after a line that marks the gap."""
        marker = self._gap_marker() if self._lost else b""
        data = marker + chunk
        done, error = self._write(data)
        if done:
            self._line_start = data[:done].endswith(b"\n")
        directory = os.path.dirname(self._path)
        if error is None:
            if self._lost:
                self._lost = 0
                self._reporter.written(directory)
            return
        if done >= len(marker):  # the earlier gap is marked: only this chunk's rest is missing now
            self._lost = 0
        if not self._lost:
            self._lost_reason = error.strerror or str(error)
        missing = len(chunk) - max(0, done - len(marker))
        self._lost += missing
        self._reporter.lost(directory, missing, error)

    def _write(self, data: bytes) -> tuple[int, OSError | None]:
        """Write ``data``, opening the file first if it could not be created before."""
        if self._file is None:
            try:
                self._file = _create_log(self._path, self._create_dir)
            except OSError as error:
                return 0, error
        return _write_all(self._file, data)

    def _gap_marker(self) -> bytes:
        start = b"" if self._line_start else b"\n"
        return start + f"[elasticrun: {self._lost} bytes of output lost here ({self._lost_reason})]\n".encode()

    def _release(self, release: Release) -> None:
        """Show what the gate let go; keep what it withheld (shown if it cannot be kept)."""
        if release.shown:
            self._to_console(release.shown)
        if release.withheld and not (self._withheld is not None and self._withheld(release.withheld)):
            self._to_console(release.withheld)

    def _to_console(self, chunk: bytes) -> None:
        if not self._prefix:  # nothing to put before each line: pass it on now (a progress bar's \r)
            self._emit([chunk])
            self._line_open = not chunk.endswith(b"\n")
            return
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        out = [line + b"\n" for line in lines]
        while len(self._partial) > MAX_LINE_BYTES:
            out.append(self._partial[:MAX_LINE_BYTES] + b"\n")
            self._partial = self._partial[MAX_LINE_BYTES:]
        if out:
            self._emit(out)

    def _emit(self, lines: list[bytes]) -> None:
        payload = b"".join(self._prefix + line for line in lines)
        with _console_lock:
            try:
                _write_bytes(self._console, payload)
            except (OSError, ValueError):
                pass  # a closed or broken console must not stop the log file


def _write_bytes(stream: IO, payload: bytes) -> None:
    buffer = getattr(stream, "buffer", None)
    if buffer is not None:
        stream.flush()
        buffer.write(payload)
        buffer.flush()
    else:
        stream.write(payload.decode("utf-8", errors="replace"))
        stream.flush()


def _fileno(stream: IO | None) -> int | None:
    try:
        return stream.fileno()  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


def _create_log(path: str, create_dir: bool) -> IO:
    """The log file at ``path``, created (truncated), unbuffered; with ``create_dir`` its
    directory too if missing (0700).

    Raises:
        OSError: it cannot be created (see :func:`open_private_file`).
    """
    if create_dir:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    return open_private_file(path, "wb", buffering=0)


def _write_all(file: IO, data: bytes) -> tuple[int, OSError | None]:
    """Write ``data`` to an unbuffered ``file``: how many bytes were written and, when it
    stopped short, why (never raises)."""
    view, done = memoryview(data), 0
    while done < len(data):
        try:
            written = file.write(view[done:])
        except OSError as error:
            return done, error
        if not written:
            return done, OSError(errno.EIO, "the write made no progress")
        done += written
    return done, None

