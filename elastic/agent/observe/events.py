"""The agent's structured event log: one JSON object per line, appended as things happen.

Each record looks like::

    {"ts": "2025-01-02T03:04:05.678+00:00", "event": "round_joined", "run_id": "job1",
     "node": "host-a-4242-1f2e3d", "host": "host-a", "round": 3, "group_rank": 0, ...}

``ts`` is wall-clock time (for people and log pipelines; nothing compares it across machines).
``node`` is the rendezvous node id (unique per agent, also with two agents on one host, and
the ``node`` label of the metrics); ``host`` is the machine's name.
Records are written with one ``write`` to a file opened with ``O_APPEND``, so several agents
may share one file without interleaving lines. The file is created owner-only and never
through a symbolic link (see :mod:`elastic.agent.private_files`). Every event is also logged at DEBUG through
``logging.getLogger(__name__)`` (``LOGLEVEL=DEBUG`` shows it; never the default console), and
handed to the listeners added with :meth:`EventLog.listen` (the run's summary counts them).

The event names and the fields each one must carry are fixed here (`Event`, `REQUIRED_FIELDS`)
so the agent cannot misspell them; extra fields are allowed.
"""

from __future__ import annotations

import datetime
import enum
import errno
import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from elastic.agent.errors import EventLogError
from elastic.agent.private_files import open_private

log = logging.getLogger(__name__)

__all__ = ["Event", "EventLog", "REQUIRED_FIELDS", "RESTART_CAUSES", "RestartCause"]


class Event(str, enum.Enum):
    """The events the agent emits. The value is the ``event`` field of the record."""

    ROUND_JOINED = "round_joined"
    ROUND_CLOSED = "round_closed"
    MEMBER_LOST = "member_lost"
    NODES_WAITING = "nodes_waiting"
    RESTART = "restart"
    WORKER_EXIT = "worker_exit"
    JOB_FINISHED = "job_finished"
    NODE_EXCLUDED = "node_excluded"
    WORKERS_STARTED = "workers_started"
    """The workers of a round started (``started``: local ranks started anew) or moved to it
    (``kept``: local ranks kept running by ``--live-recovery``); ``refill``: started in the round
    in use, replacing failed ones."""
    ROUND_FORMED = "round_formed"
    """Every live worker of this node formed the round published to it (``--live-recovery``):
    training goes on in that round."""


class RestartCause(str, enum.Enum):
    """Why the agent restarted its worker group; only ``WORKER_FAILURE`` counts as a failure.

    STORE_OUTAGE: the workers failed while the store did not answer (or within the grace period
    after); they are restarted uncharged, as the failure is most likely the outage's doing.
    """

    WORKER_FAILURE = "worker_failure"
    MEMBERSHIP_CHANGE = "membership_change"
    STORE_OUTAGE = "store_outage"


RESTART_CAUSES: frozenset[str] = frozenset(c.value for c in RestartCause)

REQUIRED_FIELDS: Mapping[Event, frozenset[str]] = {
    Event.ROUND_JOINED: frozenset(
        {"round", "group_rank", "group_world_size", "members", "duration_s"}
    ),
    Event.ROUND_CLOSED: frozenset(),
    Event.MEMBER_LOST: frozenset({"reason"}),
    Event.NODES_WAITING: frozenset({"count"}),
    Event.RESTART: frozenset({"cause", "restart_count", "remaining"}),
    Event.WORKER_EXIT: frozenset({"local_rank", "global_rank", "exitcode", "signal"}),
    Event.JOB_FINISHED: frozenset({"status"}),
    Event.NODE_EXCLUDED: frozenset({"reason", "cooldown_s", "failures_in_a_row"}),
    Event.WORKERS_STARTED: frozenset({"round", "started", "kept"}),
    Event.ROUND_FORMED: frozenset({"round"}),
}

_RESERVED_FIELDS = frozenset({"ts", "event", "run_id", "node", "host"})


class EventLog:
    """Appends one JSON line per event to ``path``; with ``path=None`` it only logs.

    Thread-safe. Each record reaches the OS before `emit` returns (no user-space buffer).

    Args:
        path: the file (None: log only).
        run_id: the run.
        node: the node id (the rendezvous' ``node_id``), not the host name: two agents on one
            host are two nodes.
        host: the machine's name (default: ``socket.gethostname()``).
        wall_clock: the time stamps' source.

    Raises:
        ValueError: at construction, if ``run_id``, ``node`` or ``host`` is empty.
        EventLogError: ``path`` cannot be opened for appending (the message names the path and
            the OS reason).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        run_id: str,
        node: str,
        host: str | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if not run_id:
            raise ValueError("The event log's run id must be a non-empty string.")
        if not node:
            raise ValueError("The event log's node id must be a non-empty string.")
        host = socket.gethostname() if host is None else host
        if not host:
            raise ValueError("The event log's host name must be a non-empty string.")
        self.run_id = run_id
        self.node = node
        self.host = host
        self.path = None if path is None else os.fspath(path)
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._write_failed = False
        self._torn = False  # the file ends in a record cut short (a full disk)
        self._fd: int | None = None
        self._listeners: list[Callable[[Mapping[str, Any]], None]] = []
        if self.path is not None:
            self._fd = _open_for_append(self.path)

    def emit(self, name: Event | str, **fields: Any) -> None:
        """Record event ``name`` with ``fields`` (plus ts, event, run_id, node and host).

        Writing errors (a full disk, say) are logged once and otherwise ignored: observability
        never stops the agent. A record cut short is ended by the next one that can be written,
        which starts on a line of its own.

        Raises:
            ValueError: ``name`` is not an `Event`, a required field is missing, a field uses a
                reserved name (ts, event, run_id, node, host), or a restart has an unknown cause.
        """
        event = _validate(name, fields)
        record: dict[str, Any] = {
            "ts": _iso8601(self._wall_clock()),
            "event": event.value,
            "run_id": self.run_id,
            "node": self.node,
            "host": self.host,
            **fields,
        }
        line = _to_json(record)
        log.debug("[%s][%s] event %s %s", self.run_id, self.node, event.value, line)
        for listener in self._listeners:
            listener(record)
        if self._fd is None:
            return
        data = (line + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:  # closed meanwhile
                return
            if self._torn:  # an earlier record was cut short: it must not swallow this one
                data = b"\n" + data
            written, e = _write_all(self._fd, data)
            if e is None:
                self._torn = False
            else:
                if written:
                    self._torn = not data[:written].endswith(b"\n")
                if not self._write_failed:
                    self._write_failed = True
                    log.warning(
                        "[%s][%s] Cannot write to the event log %s (%s); events are still "
                        "logged but further write errors are not reported.",
                        self.run_id, self.node, self.path, e.strerror or e,
                    )

    def listen(self, listener: Callable[[Mapping[str, Any]], None]) -> None:
        """Call ``listener`` with each later event's record (the dict written as JSON), in the
        emitting thread, before it is written."""
        self._listeners.append(listener)

    def close(self) -> None:
        """Close the file; idempotent. Later events are only logged."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EventLog(path={self.path!r}, run_id={self.run_id!r}, node={self.node!r}, host={self.host!r})"


def _open_for_append(path: str) -> int:
    try:
        return open_private(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    except OSError as e:
        reason = e.strerror or errno.errorcode.get(e.errno or 0, str(e))
        raise EventLogError(
            f"The event log {path!r} cannot be opened for appending: {reason}."
        ) from e


def _validate(name: Event | str, fields: Mapping[str, Any]) -> Event:
    try:
        event = Event(name)
    except ValueError:
        known = ", ".join(e.value for e in Event)
        raise ValueError(f"Unknown event {name!r}; known events: {known}.") from None
    reserved = _RESERVED_FIELDS.intersection(fields)
    if reserved:
        raise ValueError(
            f"Event {event.value!r} uses reserved field(s) {sorted(reserved)}; "
            "ts, event, run_id, node and host are set by the event log."
        )
    missing = REQUIRED_FIELDS[event].difference(fields)
    if missing:
        raise ValueError(f"Event {event.value!r} is missing required field(s) {sorted(missing)}.")
    if event is Event.RESTART and _plain(fields["cause"]) not in RESTART_CAUSES:
        raise ValueError(
            f"The restart cause {fields['cause']!r} must be one of {sorted(RESTART_CAUSES)}."
        )
    return event


def _iso8601(timestamp: float) -> str:
    moment = datetime.datetime.fromtimestamp(timestamp, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds")


def _to_json(record: Mapping[str, Any]) -> str:
    """Compact JSON; enums become their values, other foreign objects their ``str``, and
    non-finite floats ``null`` (bare NaN is not JSON)."""
    return json.dumps(_jsonable(record), separators=(",", ":"), allow_nan=False, default=str)


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return _jsonable(value.value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(_plain(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [_jsonable(v) for v in items]
    return value


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def _write_all(fd: int, data: bytes) -> tuple[int, OSError | None]:
    """Write all of ``data``: how many bytes were written and, when it stopped short, why."""
    view, done = memoryview(data), 0
    while done < len(data):
        try:
            written = os.write(fd, view[done:])
        except OSError as error:
            return done, error
        if not written:
            return done, OSError(errno.EIO, "the write made no progress")
        done += written
    return done, None
