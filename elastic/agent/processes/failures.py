"""Worker failures: the records, the error files ``@record`` writes, and the root-cause report.

torch's ``@record`` (``torch.distributed.elastic.multiprocessing.errors``) writes, to the path in
``TORCHELASTIC_ERROR_FILE``::

    {"message": {"message": "ValueError: boom",
                 "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1700000000"}}}

(``timestamp`` is a string of whole seconds; a re-raised ``ChildFailedError`` adds
``"errorCode"`` inside ``message``). An older flat form ``{"message": "...", "timestamp": N}`` is
also accepted. Anything else — missing, empty, truncated, not JSON, wrong shape — reads as no
report, never as an exception: a broken worker must not break the agent's report of it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

from backends.untrusted import parse_json
from elastic.agent.private_files import replace_file

log = logging.getLogger(__name__)

__all__ = [
    "ErrorReport",
    "WorkerFailure",
    "dump_error_file",
    "first_failure",
    "parse_error_report",
    "read_error_file",
    "read_log_tail",
    "root_cause_summary",
    "signal_name",
]

# An error file larger than this is not something @record wrote; don't load it into memory.
MAX_ERROR_FILE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class ErrorReport:
    """What a worker said about its own failure in its error file.

    Attributes:
        message: ``"<ExceptionType>: <text>"`` as ``@record`` writes it.
        traceback: the Python call stack (``py_callstack``), if given.
        timestamp: seconds since the epoch when the error was recorded, if given.
        error_code: ``errorCode``, set when the report was forwarded from a child agent.
    """

    message: str
    traceback: str | None = None
    timestamp: int | None = None
    error_code: int | None = None


@dataclass(frozen=True)
class WorkerFailure:
    """One worker that exited non-zero (or was killed by a signal).

    Attributes:
        local_rank, global_rank: the worker's ranks in the attempt.
        pid: its process id.
        exitcode: as :attr:`subprocess.Popen.returncode`: ``-N`` when killed by signal ``N``.
        exit_monotonic, exit_time: when the agent saw it exit (``time.monotonic()``,
            ``time.time()``); order failures by the first.
        error_file: the ``TORCHELASTIC_ERROR_FILE`` it was given.
        error: its parsed error file, or ``None`` when it wrote none (or garbage).
        stderr_log: its ``stderr.log``, or ``None`` when stderr went to the console.
        during_stop: it exited after the agent began stopping the group, i.e. it was most
            likely killed by the agent rather than being a cause.
    """

    local_rank: int
    global_rank: int
    pid: int
    exitcode: int
    exit_monotonic: float
    exit_time: float
    error_file: str = ""
    error: ErrorReport | None = None
    stderr_log: str | None = None
    during_stop: bool = False

    @property
    def signal(self) -> str | None:
        """The name of the signal that killed it (``"SIGKILL"``), or ``None`` if it exited."""
        return signal_name(self.exitcode)


def signal_name(exitcode: int) -> str | None:
    """``SIGKILL`` for ``-9``; ``SIG<N>`` for an unnamed signal; ``None`` for a normal exit."""
    if exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"SIG{-exitcode}"


def parse_error_report(data: Any) -> ErrorReport | None:
    """The :class:`ErrorReport` in decoded error-file JSON, or ``None`` if it has not that shape."""
    if not isinstance(data, dict) or "message" not in data:
        return None
    body = data["message"]
    if isinstance(body, str):  # the flat, older form
        return ErrorReport(message=body, timestamp=_as_int(data.get("timestamp")))
    if not isinstance(body, dict):
        return None
    extra = body.get("extraInfo")
    extra = extra if isinstance(extra, dict) else {}
    message = body.get("message")
    callstack = extra.get("py_callstack")
    if not isinstance(message, str):
        message = "<no message>"
    return ErrorReport(
        message=message,
        traceback=callstack if isinstance(callstack, str) and callstack else None,
        timestamp=_as_int(extra.get("timestamp")),
        error_code=_as_int(body.get("errorCode")),
    )


def read_error_file(path: str | None) -> ErrorReport | None:
    """Read and parse an error file; ``None`` when absent, empty, oversized or malformed."""
    if not path:
        return None
    try:
        with open(path, "rb") as fp:
            raw = fp.read(MAX_ERROR_FILE_BYTES + 1)
    except OSError:
        return None
    if not raw.strip():
        return None
    if len(raw) > MAX_ERROR_FILE_BYTES:
        log.warning("Ignoring error file %s: larger than %d bytes.", path, MAX_ERROR_FILE_BYTES)
        return None
    try:
        data = parse_json(raw.decode("utf-8", errors="replace"))
    except ValueError as error:  # also nesting too deep for the decoder
        log.warning("Ignoring error file %s: %s.", path, error)
        return None
    report = parse_error_report(data)
    if report is None:
        log.warning("Ignoring error file %s: not in the @record format.", path)
    return report


def read_log_tail(path: str | None, max_lines: int = 30, max_bytes: int = 64 * 1024) -> str | None:
    """The last ``max_lines`` lines (from at most the last ``max_bytes``) of a log, or ``None``."""
    if not path:
        return None
    try:
        with open(path, "rb") as fp:
            fp.seek(0, os.SEEK_END)
            size = fp.tell()
            fp.seek(max(0, size - max_bytes - 1))  # one byte more: is the cut at a line start?
            chunk = fp.read()
    except OSError:
        return None
    if size > max_bytes:
        chunk = chunk[chunk.find(b"\n") + 1 :]  # drop the partial first line (or the newline)
    lines = chunk.decode("utf-8", errors="replace").splitlines()
    tail = "\n".join(lines[-max_lines:]).strip("\n")
    return tail or None


def dump_error_file(failure: WorkerFailure, dest: str) -> bool:
    """Copy a worker's error report to the agent's own ``TORCHELASTIC_ERROR_FILE``.

    As torch's ``ErrorHandler.dump_error_file``: the worker's JSON with ``errorCode`` set to its
    exit code, so a scheduler watching the agent sees the worker's root cause. Returns whether
    a report was written (``False`` when the worker left none).

    Raises:
        OSError: ``dest`` cannot be written.
    """
    if failure.error is None:
        return False
    try:
        with open(failure.error_file, "rb") as fp:
            data = parse_json(fp.read(MAX_ERROR_FILE_BYTES + 1), max_bytes=MAX_ERROR_FILE_BYTES)
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict):
        return False
    if isinstance(data.get("message"), dict) and failure.exitcode:
        data["message"]["errorCode"] = failure.exitcode
    replace_file(dest, lambda out: out.write(json.dumps(data).encode("utf-8")))
    return True


def first_failure(failures: Iterable[WorkerFailure]) -> WorkerFailure | None:
    """The root cause: the earliest failure not caused by the agent's stop (else the earliest)."""
    ordered = sorted(failures, key=lambda f: (f.during_stop, f.exit_monotonic, f.global_rank))
    return ordered[0] if ordered else None


def root_cause_summary(
    failures: Iterable[WorkerFailure],
    host: str,
    role: str,
    *,
    stderr_tails: Mapping[int, str] | None = None,
    width: int = 80,
) -> str:
    """A report of a failed worker group, root cause first, for the agent's console and logs.

    ``stderr_tails`` maps local rank to the tail of that worker's stderr log; it is shown when
    the root cause wrote no error file.
    """
    failures = list(failures)
    root = first_failure(failures)
    rule, thin = "=" * width, "-" * width
    if root is None:
        return "\n".join([rule, f"{role} worker group on {host}: no worker failed", rule])
    lines = [rule, f"{role} FAILED on {host}: {len(failures)} worker(s) failed", thin]
    lines.append("Root cause (first observed failure):")
    lines.extend(_describe(root, host))
    lines.extend(_root_detail(root, (stderr_tails or {}).get(root.local_rank)))
    others = [f for f in failures if f is not root]
    if others:
        lines.append(thin)
        lines.append("Other failures:")
        for f in sorted(others, key=lambda f: (f.exit_monotonic, f.global_rank)):
            cause = f.error.message if f.error else ""
            note = " (after the agent began stopping workers)" if f.during_stop else ""
            lines.append(
                f"  rank {f.global_rank} (local_rank {f.local_rank}, pid {f.pid}): "
                f"{_exit_text(f)}{note}" + (f" — {cause}" if cause else "")
            )
    lines.append(rule)
    return "\n".join(lines)


def _describe(f: WorkerFailure, host: str) -> list[str]:
    when = datetime.fromtimestamp(f.exit_time, tz=timezone.utc).isoformat(timespec="milliseconds")
    return [
        f"  rank       : {f.global_rank} (local_rank {f.local_rank})",
        f"  host       : {host}",
        f"  pid        : {f.pid}",
        f"  exit       : {_exit_text(f)}",
        f"  time       : {when}",
        f"  error file : {f.error_file if f.error else '<none written>'}",
    ]


def _root_detail(f: WorkerFailure, stderr_tail: str | None) -> list[str]:
    if f.error is not None:
        lines = [f"  error      : {f.error.message}"]
        if f.error.traceback:
            lines.append("  traceback  :")
            lines.extend("    " + line for line in f.error.traceback.rstrip("\n").splitlines())
        return lines
    if stderr_tail:
        lines = [f"  stderr (last lines of {f.stderr_log or 'stderr'}):"]
        lines.extend("    " + line for line in stderr_tail.splitlines())
        return lines
    hint = "  (no error file: decorate the entrypoint with "
    hint += "torch.distributed.elastic.multiprocessing.errors.record for a traceback"
    hint += ", or use --redirects to keep stderr)" if f.stderr_log is None else ")"
    return [hint]


def _exit_text(f: WorkerFailure) -> str:
    name = f.signal
    if name is not None:
        return f"killed by signal {name} ({-f.exitcode})"
    return f"exit code {f.exitcode}"


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
