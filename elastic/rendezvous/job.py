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
    "FinishedRecord",
    "JobIdentity",
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
