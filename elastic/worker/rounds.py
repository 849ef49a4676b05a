"""The two pipes between an agent and a live worker, one codec each: the round a worker is in
(from its environment or a line of the round pipe), and the worker's answers on the ready pipe.

Pure and torch-free (no I/O beyond the mapping it is given), so the agent side can import it
to write the lines its workers read and read theirs, and the tests can check both ends against
one format.

The round pipe (agent → worker, ``ELASTIC_ROUND_FD``): one line of JSON per round, UTF-8,
``\\n``-terminated, at most :data:`MAX_LINE_BYTES`::

    {"v": 1, "round": 7, "rank": 2, "world_size": 4, "local_rank": 0, "local_world_size": 1,
     "group_rank": 2, "master_addr": "10.0.0.1", "master_port": 29500, "restart_count": 0,
     "store_prefix": "etcd-elastic/live/job/round-7"}

Unknown fields are ignored (so the agent may add some without a version bump); a missing or
mistyped field, or another ``v``, makes the line invalid.

The agent also writes, after each renewal of its lease, a line saying until when the store
cannot have dropped the node (``time.monotonic()``, one clock per machine)::

    {"v": 1, "held_until": 81234.5}

A worker that completes a collective after a stall uses it to tell whether its peers may have
gone on without it (see :func:`elastic.worker.decisions.commit_fence`).

The ready pipe (worker → agent, ``ELASTIC_READY_FD``): one line of JSON per event of the
worker's recovery (:class:`ReadyEvent`), at most :data:`MAX_READY_BYTES`::

    {"v": 1, "event": "formed", "round": 7, "rank": 2, "step": 120}

It exists because the agent cannot otherwise tell a worker that re-formed round R from one still
stuck forming it. Unknown fields are ignored, as on the round pipe; a missing or mistyped field,
an unknown event, or another ``v`` makes the line invalid.

The environment a worker starts with describes its first round: torchrun's variables plus
``ELASTIC_ROUND`` and ``ELASTIC_STORE_PREFIX`` (required when ``ELASTIC_ROUND_FD`` is set, so a
worker never mistakes a repeat of its own round for a new one).
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, MutableMapping

from elastic.worker.errors import ReadyLineError, RoundLineError, WorkerEnvError

__all__ = [
    "FORMAT_VERSION",
    "MAX_LINE_BYTES",
    "MAX_READY_BYTES",
    "READY_FD_VAR",
    "ROUND_FD_VAR",
    "ROUND_VAR",
    "STORE_PREFIX_VAR",
    "Held",
    "Ready",
    "ReadyEvent",
    "Round",
    "default_store_prefix",
    "encode_held_line",
    "encode_ready_line",
    "encode_round_line",
    "export_round",
    "parse_pipe_line",
    "parse_ready_line",
    "parse_round_line",
    "round_from_env",
]

FORMAT_VERSION = 1
MAX_LINE_BYTES = 64 * 1024
"""A longer line is garbage: the reader drops it up to the next newline."""
MAX_READY_BYTES = 4096
"""The longest ready line read (a real one is under 100 bytes); the agent skips a longer one unparsed."""
MAX_TEXT = 1024
"""Longest ``master_addr`` or ``store_prefix`` accepted."""

ROUND_FD_VAR = "ELASTIC_ROUND_FD"
READY_FD_VAR = "ELASTIC_READY_FD"
ROUND_VAR = "ELASTIC_ROUND"
STORE_PREFIX_VAR = "ELASTIC_STORE_PREFIX"

_INT_FIELDS = (
    "round", "rank", "world_size", "local_rank", "local_world_size", "group_rank",
    "master_port", "restart_count",
)
_TEXT_FIELDS = ("master_addr", "store_prefix")


@dataclass(frozen=True)
class Round:
    """One round as this worker sees it: its ranks, where the round's store is, and its prefix.

    Raises (on construction):
        ValueError: a value is out of range or inconsistent with another; the message says which.
    """

    round: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    group_rank: int
    master_addr: str
    master_port: int
    restart_count: int
    store_prefix: str

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if type(value) is not int:  # bool is an int subclass: reject it too
                raise ValueError(f"The round field {name!r} must be an integer, not {value!r}.")
        for name in _TEXT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
                raise ValueError(f"The round field {name!r} must be a non-empty string of at most {MAX_TEXT} characters.")
        if self.round < 0 or self.restart_count < 0 or self.group_rank < 0:
            raise ValueError(f"round ({self.round}), restart_count ({self.restart_count}) and group_rank ({self.group_rank}) must not be negative.")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"The rank ({self.rank}) must be in [0, world_size={self.world_size}).")
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(f"The local rank ({self.local_rank}) must be in [0, local_world_size={self.local_world_size}).")
        if not 1 <= self.master_port <= 65535:
            raise ValueError(f"The master port ({self.master_port}) must be in [1, 65535].")


@dataclass(frozen=True)
class Held:
    """The store cannot have dropped this node before ``until`` (``time.monotonic()``)."""

    until: float


def encode_held_line(held: Held) -> bytes:
    """The pipe line for ``held`` (what the agent writes after a lease renewal), newline included."""
    return json.dumps({"v": FORMAT_VERSION, "held_until": held.until}, separators=(",", ":")).encode() + b"\n"


def parse_pipe_line(line: bytes) -> Round | Held:
    """A round line or a held line (see the module docstring).

    Raises:
        RoundLineError: as :func:`parse_round_line`; or a held line whose time is not a finite number.
    """
    value = _json_object(line)
    if "held_until" in value and "round" not in value:
        until = value["held_until"]
        if type(until) not in (int, float) or not math.isfinite(until):
            raise RoundLineError(f"held_until must be a finite number, not {until!r}")
        return Held(float(until))
    return _round(value)


def encode_round_line(round_: Round) -> bytes:
    """The pipe line for ``round_`` (what the agent writes), newline included."""
    line = json.dumps({"v": FORMAT_VERSION, **asdict(round_)}, separators=(",", ":")).encode() + b"\n"
    if len(line) > MAX_LINE_BYTES:
        raise ValueError(f"The round line is {len(line)} bytes, over the {MAX_LINE_BYTES}-byte limit.")
    return line


def parse_round_line(line: bytes) -> Round:
    """The round a pipe line describes (with or without its newline).

    Raises:
        RoundLineError: the line is not UTF-8 JSON, not an object, of another version, or a
            field is missing or out of range; the message says which.
    """
    return _round(_json_object(line))


def _json_object(line: bytes, limit: int = MAX_LINE_BYTES, error: type[ValueError] = RoundLineError,
                 reader: str = "worker") -> dict[str, Any]:
    if len(line) > limit:
        raise error(f"the line is {len(line)} bytes, over the {limit}-byte limit")
    try:
        value: Any = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as cause:
        raise error(f"the line is not UTF-8 JSON: {cause}") from cause
    if not isinstance(value, dict):
        raise error(f"the line is JSON {type(value).__name__}, not an object")
    if value.get("v") != FORMAT_VERSION:
        raise error(f"the line has version {value.get('v')!r}; this {reader} reads version {FORMAT_VERSION}")
    return value


def _round(value: dict[str, Any]) -> Round:
    missing = [name for name in (*_INT_FIELDS, *_TEXT_FIELDS) if name not in value]
    if missing:
        raise RoundLineError(f"the line lacks {', '.join(missing)}")
    try:
        return Round(**{name: value[name] for name in (*_INT_FIELDS, *_TEXT_FIELDS)})
    except ValueError as error:
        raise RoundLineError(str(error)) from error


class ReadyEvent(str, enum.Enum):
    """What a worker tells its agent about a round on the ready pipe."""

    JOINING = "joining"
    """Started in round R, it has imported torch and built its state, and is about to form R. An
    agent that replaces a worker publishes R to the survivors on this line, not at the
    replacement's fork: they then wait in R's barrier for a group setup, not for an import."""
    FORMED = "formed"
    """It formed round R and healed; it trains from step s."""
    LOST = "lost"
    """Its group of round R was lost (a collective failed or was abandoned); it waits for a newer round."""


@dataclass(frozen=True)
class Ready:
    """One line of the ready pipe: a worker's event for a round, its rank there, and its step.

    Raises (on construction):
        ValueError: a number is not a non-negative integer, or the event is not a :class:`ReadyEvent`.
    """

    event: ReadyEvent
    round: int
    rank: int
    step: int

    def __post_init__(self) -> None:
        if not isinstance(self.event, ReadyEvent):
            raise ValueError(f"The ready event must be a ReadyEvent, not {self.event!r}.")
        for name in ("round", "rank", "step"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:  # bool is an int subclass: reject it too
                raise ValueError(f"The ready field {name!r} must be a non-negative integer, not {value!r}.")


def encode_ready_line(ready: Ready) -> bytes:
    """The pipe line for ``ready`` (what a worker writes), newline included."""
    fields = {"v": FORMAT_VERSION, "event": ready.event.value, "round": ready.round, "rank": ready.rank, "step": ready.step}
    return json.dumps(fields, separators=(",", ":")).encode() + b"\n"


def parse_ready_line(line: bytes) -> Ready:
    """The answer a ready-pipe line holds (with or without its newline).

    Raises:
        ReadyLineError: the line is longer than :data:`MAX_READY_BYTES`, not UTF-8 JSON, not an
            object, of another version, names no known event, or a field is missing or out of
            range; the message says which.
    """
    value = _json_object(line, MAX_READY_BYTES, ReadyLineError, "agent")
    missing = [name for name in ("event", "round", "rank", "step") if name not in value]
    if missing:
        raise ReadyLineError(f"the line lacks {', '.join(missing)}")
    try:
        event = ReadyEvent(value["event"])
    except ValueError:
        raise ReadyLineError(f"the event {str(value['event'])[:40]!r} is none of "
                             f"{', '.join(e.value for e in ReadyEvent)}") from None
    try:
        return Ready(event, value["round"], value["rank"], value["step"])
    except ValueError as error:
        raise ReadyLineError(str(error)) from error


def default_store_prefix(run_id: str, round_number: int) -> str:
    """The prefix a round's keys live under when the agent names none (also the agent's default)."""
    return f"etcd-elastic/live/{run_id}/round-{round_number}"


def _int_var(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = environ.get(name)
    if text is None or text == "":
        if default is None:
            raise WorkerEnvError(f"The worker environment lacks {name}; start the worker with elasticrun or torchrun.")
        return default
    try:
        return int(text)
    except ValueError:
        raise WorkerEnvError(f"{name}={text!r} is not an integer.") from None


def round_from_env(environ: Mapping[str, str]) -> Round:
    """The round a worker starts in, from torchrun's variables and ``ELASTIC_ROUND``/``ELASTIC_STORE_PREFIX``.

    Without ``ELASTIC_ROUND_FD`` (a job that did not opt in, or stock torchrun) the round number
    defaults to the restart count and the prefix to :func:`default_store_prefix`.

    Raises:
        WorkerEnvError: a variable is missing, not an integer, or out of range.
    """
    live = bool(environ.get(ROUND_FD_VAR))
    restart_count = _int_var(environ, "TORCHELASTIC_RESTART_COUNT", 0)
    number = _int_var(environ, ROUND_VAR, None if live else restart_count)
    run_id = environ.get("TORCHELASTIC_RUN_ID") or "none"
    master_addr = environ.get("MASTER_ADDR")
    if not master_addr:
        raise WorkerEnvError("The worker environment lacks MASTER_ADDR; start the worker with elasticrun or torchrun.")
    prefix = environ.get(STORE_PREFIX_VAR)
    if live and not prefix:
        raise WorkerEnvError(f"{ROUND_FD_VAR} is set but {STORE_PREFIX_VAR} is not; the agent must name the first round's prefix.")
    try:
        return Round(
            round=number,
            rank=_int_var(environ, "RANK"),
            world_size=_int_var(environ, "WORLD_SIZE"),
            local_rank=_int_var(environ, "LOCAL_RANK", 0),
            local_world_size=_int_var(environ, "LOCAL_WORLD_SIZE", 1),
            group_rank=_int_var(environ, "GROUP_RANK", 0),
            master_addr=master_addr,
            master_port=_int_var(environ, "MASTER_PORT"),
            restart_count=restart_count,
            store_prefix=prefix or default_store_prefix(run_id, number),
        )
    except ValueError as error:
        raise WorkerEnvError(f"The worker environment is inconsistent: {error}") from error


def export_round(round_: Round, environ: MutableMapping[str, str]) -> None:
    """Write ``round_`` into ``environ`` under torchrun's names, so code that reads the
    environment (a subprocess, a library) sees the round the worker is in now."""
    environ.update({
        "RANK": str(round_.rank),
        "WORLD_SIZE": str(round_.world_size),
        "LOCAL_RANK": str(round_.local_rank),
        "LOCAL_WORLD_SIZE": str(round_.local_world_size),
        "GROUP_RANK": str(round_.group_rank),
        "MASTER_ADDR": round_.master_addr,
        "MASTER_PORT": str(round_.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(round_.restart_count),
        ROUND_VAR: str(round_.round),
        STORE_PREFIX_VAR: round_.store_prefix,
    })
