"""Reading agents' event logs (``--event-log``) for the timeline, tolerant and in bounded memory.

Each line should be one JSON object as :mod:`elastic.agent.observe.events` writes it. A line that
is not (torn, binary, too long), an event this version does not know, or a known event whose
fields have the wrong types or values out of range (a time stamp outside `EARLIEST`..`LATEST`,
a duration beyond `MAX_SECONDS`) is skipped and counted, never fatal: `read_log` returns what it
could read and a `Skipped` tally whose `Skipped.line` says it in one printable line (names from the
file with control characters escaped, so a log cannot drive the terminal). Memory stays bounded
whatever the file: a line is read at most ``max_line_bytes`` at a time, only the fields the
timeline draws are kept (strings cut to ``max_text``), and at most ``max_events`` events per file.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from elastic.agent.observe.events import Event

__all__ = ["EARLIEST", "LATEST", "MAX_SECONDS", "BadRecord", "ReadLimits", "Record", "Skipped", "UnknownEvent",
           "parse_line", "printable", "read_log"]

EARLIEST = 0.0
"""The earliest time stamp read (1970-01-01, seconds since the epoch): an agent writes ``time.time()``."""
LATEST = 253_402_214_400.0
"""The latest time stamp read (9999-12-31): every later one is beyond what a date can say."""
MAX_SECONDS = 366 * 86400.0
"""The longest duration read (a rendezvous' ``duration_s``, an exclusion's ``cooldown_s``): a year."""


@dataclass(frozen=True)
class ReadLimits:
    """How much of a file is read. Raises ValueError when a limit is not positive."""

    max_line_bytes: int = 64 * 1024
    max_events: int = 20_000
    max_text: int = 300
    max_file_bytes: int = 1 << 30
    """Past this, the rest of a file is not read (a device or a runaway file never ends)."""

    def __post_init__(self) -> None:
        for name in ("max_line_bytes", "max_events", "max_text", "max_file_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"The timeline's {name} ({getattr(self, name)}) must be positive.")


@dataclass(frozen=True)
class Record:
    """One event of one node: wall time (seconds since the epoch), the event, who, and the
    fields the timeline uses (checked: see `_FIELDS`)."""

    at: float
    event: Event
    node: str
    host: str
    run_id: str
    fields: Mapping[str, Any] = field(default_factory=dict, compare=True, hash=False)
    source: str = ""
    """The file it was read from ("" when not read from a file)."""


@dataclass(frozen=True)
class Skipped:
    """What one file's reading skipped."""

    path: str
    corrupt: int = 0
    unknown: int = 0
    too_long: int = 0
    beyond_limit: int = 0
    first_line: int = 0
    """The first skipped line's number (1-based; 0: none)."""
    unknown_names: tuple[str, ...] = ()
    """The first few unknown event names."""
    kept_limit: int = 0
    """The most events kept (`ReadLimits.max_events`)."""
    unread_from: int = 0
    """The byte offset where reading stopped at `ReadLimits.max_file_bytes` (0: read to the end)."""

    @property
    def total(self) -> int:
        return self.corrupt + self.unknown + self.too_long + self.beyond_limit

    @property
    def anything(self) -> bool:
        """Whether anything was skipped or left unread."""
        return bool(self.total or self.unread_from)

    def line(self) -> str:
        """``events.jsonl: skipped 3 lines (2 not events; 1 unknown event: foo), the first at line 7``,
        printable (see `printable`)."""
        unread = f"; stopped reading at byte {self.unread_from}" if self.unread_from else ""
        path = printable(self.path)
        if not self.total:
            return f"{path}: stopped reading at byte {self.unread_from} (the file is too large)"
        parts = []
        if self.corrupt:
            parts.append(f"{self.corrupt} not events")
        if self.unknown:
            names = ", ".join(printable(name) for name in self.unknown_names)
            parts.append(f"{self.unknown} unknown event{'s' if self.unknown > 1 else ''}: {names}")
        if self.too_long:
            parts.append(f"{self.too_long} too long")
        if self.beyond_limit:
            parts.append(f"{self.beyond_limit} beyond the first {self.kept_limit} events")
        return (f"{path}: skipped {self.total} line{'s' if self.total > 1 else ''} ({'; '.join(parts)}), "
                f"the first at line {self.first_line}{unread}")


_Check = Callable[[Any], bool]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _is_seconds(value: Any) -> bool:
    return _is_number(value) and 0 <= value <= MAX_SECONDS


def _is_int_list(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(v) for v in value)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _optional(check: _Check) -> _Check:
    return lambda value: value is None or check(value)


# The fields the timeline reads, per event: (required, checks). Others are dropped at reading.
_FIELDS: Mapping[Event, tuple[frozenset[str], Mapping[str, _Check]]] = {
    Event.ROUND_JOINED: (frozenset({"round", "group_world_size", "duration_s"}),
                         {"round": _is_int, "group_rank": _is_int, "group_world_size": _is_int,
                          "world_size": _is_int, "duration_s": _is_seconds, "members": _is_str_list}),
    Event.ROUND_CLOSED: (frozenset(), {"round": _is_int}),
    Event.MEMBER_LOST: (frozenset(), {"reason": _is_str}),
    Event.NODES_WAITING: (frozenset(), {"count": _is_int, "reason": _is_str}),
    Event.RESTART: (frozenset({"cause"}), {"cause": _is_str, "restart_count": _is_int, "remaining": _is_int,
                                           "reason": _is_str}),
    Event.WORKER_EXIT: (frozenset(), {"local_rank": _is_int, "global_rank": _optional(_is_int),
                                      "exitcode": _optional(_is_int), "signal": _optional(_is_str)}),
    Event.JOB_FINISHED: (frozenset({"status"}), {"status": _is_str}),
    Event.NODE_EXCLUDED: (frozenset({"cooldown_s"}), {"reason": _is_str, "cooldown_s": _is_seconds,
                                                      "failures_in_a_row": _is_int}),
    Event.WORKERS_STARTED: (frozenset({"round", "started", "kept"}),
                            {"round": _is_int, "started": _is_int_list, "kept": _is_int_list, "refill": _is_bool}),
    Event.ROUND_FORMED: (frozenset({"round"}), {"round": _is_int}),
}
_KNOWN = {event.value: event for event in Event}


class BadRecord(ValueError):
    """A line that is not an event record as the timeline reads it (the message says why)."""


class UnknownEvent(BadRecord):
    """A record of an event this version does not know (from a newer agent, say)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown event {name!r}")
        self.name = name


def parse_line(line: bytes, max_text: int = ReadLimits.max_text) -> Record:
    """One event log line as a `Record`.

    Raises:
        BadRecord: the line is not an event record with the fields the timeline reads, of the
            right types; `UnknownEvent` (a subclass) for an event this version does not know.
    """
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        raise BadRecord(f"not JSON ({error})") from None
    if not isinstance(record, dict):
        raise BadRecord("not a JSON object")
    name, node = record.get("event"), record.get("node")
    if not isinstance(name, str) or not isinstance(node, str) or not node:
        raise BadRecord("no event name or node")
    event = _KNOWN.get(name)
    if event is None:
        raise UnknownEvent(name[:max_text])
    at = _seconds(record.get("ts"))
    required, checks = _FIELDS[event]
    kept: dict[str, Any] = {}
    for key, check in checks.items():
        if key not in record:
            if key in required:
                raise BadRecord(f"{name} without {key}")
            continue
        if not check(record[key]):
            raise BadRecord(f"{name} with a bad {key}")
        kept[key] = _cut(record[key], max_text)
    host, run_id = record.get("host"), record.get("run_id")
    # Logs of agents before the node id: node was the host name.
    host = host if isinstance(host, str) and host else node
    return Record(at, event, _cut(node, max_text), _cut(host, max_text),
                  _cut(run_id, max_text) if isinstance(run_id, str) else "", kept)


def _seconds(ts: Any) -> float:
    if not isinstance(ts, str):
        raise BadRecord("no time stamp")
    try:
        moment = datetime.datetime.fromisoformat(ts)
    except ValueError:
        raise BadRecord(f"a bad time stamp {ts[:40]!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    seconds = moment.timestamp()
    if not EARLIEST <= seconds <= LATEST:
        raise BadRecord(f"a time stamp out of range {ts[:40]!r}")
    return seconds


def printable(text: str) -> str:
    """``text`` with every control or unprintable character escaped (``\\x1b``): safe on a terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _cut(value: Any, max_text: int) -> Any:
    """``value`` with strings cut to ``max_text`` characters and lists to ``max_text`` items."""
    if isinstance(value, str):
        return value if len(value) <= max_text else value[: max_text - 1] + "…"
    if isinstance(value, list):
        return [_cut(v, max_text) for v in value[:max_text]]
    return value


def read_log(stream: IO[bytes], path: str, limits: ReadLimits = ReadLimits()) -> tuple[list[Record], Skipped]:
    """The records of one event log (their `Record.source` is ``path``) and what was skipped.
    Reads ``stream`` to its end or to ``limits.max_file_bytes`` in bounded memory, and keeps at
    most ``limits.max_events`` records."""
    records: list[Record] = []
    counts = {"corrupt": 0, "unknown": 0, "too_long": 0, "beyond_limit": 0}
    unknown: dict[str, None] = {}
    first = 0
    lines = _Lines(stream, limits.max_line_bytes, limits.max_file_bytes)
    for number, line, whole in lines:
        problem = ""
        if not whole:
            problem = "too_long"
        elif not line.strip():
            continue
        elif len(records) >= limits.max_events:
            problem = "beyond_limit"
        else:
            try:
                records.append(dataclasses.replace(parse_line(line, limits.max_text), source=path))
            except UnknownEvent as error:
                problem = "unknown"
                if len(unknown) < 5:
                    unknown[error.name[:40]] = None
            except BadRecord:
                problem = "corrupt"
        if problem:
            counts[problem] += 1
            first = first or number
    return records, Skipped(path, first_line=first, unknown_names=tuple(unknown), kept_limit=limits.max_events,
                            unread_from=lines.stopped_at, **counts)


class _Lines:
    """Iterates ``(number, line, whole)``; a line longer than ``max_line`` bytes is read past in
    pieces and given as ``(number, b"", False)``. Stops after ``max_total`` bytes, setting
    ``stopped_at`` to the offset."""

    def __init__(self, stream: IO[bytes], max_line: int, max_total: int) -> None:
        self._stream, self._max_line, self._max_total = stream, max_line, max_total
        self.stopped_at = 0

    def __iter__(self) -> Iterator[tuple[int, bytes, bool]]:
        number = consumed = 0
        while True:
            chunk = self._read()
            if not chunk:
                return
            consumed += len(chunk)
            number += 1
            whole = len(chunk) <= self._max_line or chunk.endswith(b"\n")
            while not whole and chunk and not chunk.endswith(b"\n") and consumed <= self._max_total:
                chunk = self._read()
                consumed += len(chunk)
            if consumed > self._max_total:
                self.stopped_at = consumed
                return
            yield number, chunk if whole else b"", whole

    def _read(self) -> bytes:
        return self._stream.readline(self._max_line + 1)
