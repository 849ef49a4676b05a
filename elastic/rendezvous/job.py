"""The job behind a run id, as ``state/`` records it: which job owns the id, and its end.

* :class:`JobIdentity` (``state/job``): the fingerprint of the job's command, written once
  (put-if-absent) by the first node that joins the run id. Every node checks its own
  fingerprint against it before its first join, and each join compares the record it checked
  (its create revision) inside the join transaction: a node of another job that reuses the run
  id is refused and writes nothing, so the running job never sees it.
* :class:`FinishedRecord` (``state/finished``): the first node whose workers all succeeded,
  written once (put-if-absent) as soon as they did, before the exit barrier. torchrun's rule,
  decided in the store: the first node to succeed ends the job for everyone. Joins and closes
  compare it absent, so no round forms after it.

:func:`job_identity` computes a fingerprint from the command line (pure). What goes in: how
the entrypoint is run (script, ``-m`` module or ``--no-python`` command), the entrypoint as
given, and the *names* of its options. Not their values, nor positional arguments: a node-local
checkpoint path or data directory differs per machine legitimately, and so does
``--nproc-per-node``. ``--rdzv-conf job_fingerprint=NAME`` replaces the computed fingerprint
(every node of one job gives the same NAME). The command shown in a refusal is truncated and
has the values of secret-looking options masked.

:func:`arrival_outcome` (pure) says how a node that was never in a round ends when it meets
the job's end: one that joined a round and waited (a spare, a late joiner) exits 0; one that
arrived after the end ran nothing under a reused ``--rdzv-id`` and exits
:data:`ALREADY_FINISHED_EXIT_CODE`, so that a pipeline notices (``--rdzv-conf
already_finished_ok=1``: 0). A node whose workers ran in a round of the job exits 0 (its agent
says why it stops).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shlex
from dataclasses import dataclass
from typing import Sequence

from elastic.rendezvous.records import corrupt_record, dump_record, is_count, load_record

__all__ = [
    "ALREADY_FINISHED_EXIT_CODE",
    "ArrivalOutcome",
    "FinishedRecord",
    "JobIdentity",
    "arrival_outcome",
    "decode_finished",
    "decode_job",
    "encode_finished",
    "encode_job",
    "job_identity",
    "shown_command",
]

COMMAND_CHARS = 160
"""The longest command a refusal quotes (the rest is cut, with '...')."""

MASK = "REDACTED"
"""What a secret-looking value is shown as."""

ALREADY_FINISHED_EXIT_CODE = 3
"""The exit code of a node that arrives after its run id's job finished: nothing ran (1 is a
failure, 2 a bad command line)."""

_SECRET = re.compile(r"pass(word|wd)?|secret|token|key|credential|auth", re.IGNORECASE)
_URL_USER = re.compile(r"(://)[^/@\s]+@")


@dataclass(frozen=True)
class JobIdentity:
    """Which job a node belongs to: a fingerprint, and the command it came from (for messages)."""

    fingerprint: str
    command: str

    def matches(self, other: "JobIdentity") -> bool:
        return self.fingerprint == other.fingerprint


@dataclass(frozen=True)
class FinishedRecord:
    """The first node whose workers all succeeded: its id, its round, and when (wall time)."""

    node_id: str
    round: int
    at: float


@dataclass(frozen=True)
class ArrivalOutcome:
    """How a node that was in no round of the job ends at its end: the line, the exit code and
    the status of its ``job_finished`` event."""

    line: str
    exit_code: int
    status: str


def arrival_outcome(finished_on: str, finished_round: int, joined: bool, already_finished_ok: bool) -> ArrivalOutcome:
    """The outcome of a node that met the end of the job (finished on node ``finished_on`` in
    round ``finished_round``) without ever being in a round of it. Pure.

    ``joined``: it had joined a round (written its join key) and waited to be included: it
    took part in the job as a spare or a late joiner, and exits 0. Otherwise it arrived after
    the end: nothing ran under this ``--rdzv-id`` (most likely reused for a new run), so it
    exits :data:`ALREADY_FINISHED_EXIT_CODE`, or 0 with ``already_finished_ok``.
    """
    ended = f"the job finished on node {finished_on} in round {finished_round}"
    if joined:
        return ArrivalOutcome(f"{ended} while this node waited to join; it trained nothing and stops", 0,
                              "finished_while_waiting")
    how = "use a new --rdzv-id to run the job again"
    if already_finished_ok:
        return ArrivalOutcome(f"{ended} before this node arrived; nothing to do ({how})", 0, "already_finished")
    return ArrivalOutcome(f"{ended} before this node arrived; nothing to do, exit code {ALREADY_FINISHED_EXIT_CODE} "
                          f"({how}, or add --rdzv-conf already_finished_ok=1 to exit 0 here)",
                          ALREADY_FINISHED_EXIT_CODE, "already_finished")


def job_identity(kind: str, entrypoint: str, args: Sequence[str], explicit: str | None = None) -> JobIdentity:
    """The identity of a job whose workers run ``entrypoint args...`` (see the module docstring). Pure.

    ``kind``: ``script``, ``module`` (``-m``), ``command`` (``--no-python``) or ``run_path``.
    ``explicit``: ``--rdzv-conf job_fingerprint``; it replaces the computed fingerprint.
    """
    command = shown_command([*(["-m"] if kind == "module" else []), entrypoint, *args])
    if explicit:
        return JobIdentity(_digest({"explicit": explicit}), f"{command} (job_fingerprint={explicit})")
    path_like = kind in ("script", "run_path")
    shape = {"kind": kind, "entrypoint": os.path.normpath(entrypoint) if path_like else entrypoint,
             "options": sorted({_option_name(arg) for arg in args if _is_option(arg)})}
    return JobIdentity(_digest(shape), command)


def shown_command(argv: Sequence[str]) -> str:
    """``argv`` as one shell-quoted line for a message: secret-looking option values and URL
    credentials masked, cut to :data:`COMMAND_CHARS`."""
    shown: list[str] = []
    mask_next = False
    for arg in argv:
        if mask_next and not _is_option(arg):
            shown.append(MASK)
            mask_next = False
            continue
        mask_next = False
        if _is_option(arg) and _SECRET.search(_option_name(arg)):
            name, equals, _ = arg.partition("=")
            shown.append(f"{name}={MASK}" if equals else arg)
            mask_next = not equals
            continue
        shown.append(_URL_USER.sub(rf"\1{MASK}@", arg))
    line = shlex.join(shown)
    return line if len(line) <= COMMAND_CHARS else line[:COMMAND_CHARS - 3] + "..."


def _is_option(arg: str) -> bool:
    return arg.startswith("-") and len(arg) > 1 and not re.fullmatch(r"-[\d.]+(e-?\d+)?", arg)


def _option_name(arg: str) -> str:
    return arg.partition("=")[0]


def _digest(shape: dict) -> str:
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


# -- records -------------------------------------------------------------------------------------
def encode_job(identity: JobIdentity) -> bytes:
    return dump_record({"fingerprint": identity.fingerprint, "command": identity.command})


def decode_job(key: str, raw: bytes) -> JobIdentity:
    """Raises RendezvousStateError when ``raw`` is not a valid job identity record."""
    body = load_record(key, raw)
    fingerprint, command = body.get("fingerprint"), body.get("command")
    if not (isinstance(fingerprint, str) and fingerprint and isinstance(command, str)):
        raise corrupt_record(key, "a job record needs a fingerprint and a command")
    return JobIdentity(fingerprint, command)


def encode_finished(record: FinishedRecord) -> bytes:
    return dump_record({"node": record.node_id, "round": record.round, "at": record.at})


def decode_finished(key: str, raw: bytes) -> FinishedRecord:
    """Raises RendezvousStateError when ``raw`` is not a valid finished record."""
    body = load_record(key, raw)
    node, number, at = body.get("node"), body.get("round"), body.get("at")
    if not (isinstance(node, str) and node and is_count(number) and type(at) in (int, float)
            and math.isfinite(at)):
        raise corrupt_record(key, "a finished record needs a node id, a round number and a time")
    return FinishedRecord(node, number, float(at))
