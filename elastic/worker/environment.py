"""A live worker's environment, read and checked once: its first round, its run, and its pipes.

Torch-free. What the agent (or torchrun) hands a worker through its environment: torchrun's
variables and ``ELASTIC_ROUND``/``ELASTIC_STORE_PREFIX`` (:func:`elastic.worker.rounds.round_from_env`),
the round and ready pipes' descriptors (``ELASTIC_ROUND_FD``, ``ELASTIC_READY_FD``), and whether
the worker replaces one of its first round (``ELASTIC_REFILL``, :mod:`elastic.worker.refill`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from elastic.worker.errors import WorkerEnvError
from elastic.worker.refill import refill_from_env
from elastic.worker.rounds import READY_FD_VAR, ROUND_FD_VAR, Round, round_from_env

__all__ = ["WorkerEnv", "read_worker_env"]

_MAX_FD = 2**31 - 1
"""The largest descriptor number an ``int`` of C holds (``os.fstat`` overflows past it)."""


@dataclass(frozen=True)
class WorkerEnv:
    """What a live worker starts with."""

    first: Round
    """The round the worker starts in."""
    run_id: str
    round_fd: int | None
    """The round pipe's read end; ``None`` without one (stock torchrun: no round will come)."""
    ready_fd: int | None
    """The ready pipe's write end; ``None`` without one."""
    replaces: bool
    """The worker replaces one of its first round (with a round pipe only)."""
    label: str
    """How log lines name this worker before it knows its round: ``run <id> pid <pid>``."""

    @property
    def has_pipe(self) -> bool:
        return self.round_fd is not None


def read_worker_env(environ: Mapping[str, str]) -> WorkerEnv:
    """The worker's start, from ``environ``.

    Raises:
        WorkerEnvError: a variable is missing, not an integer, out of range, or names a
            descriptor this process does not hold; the message names it.
    """
    first = round_from_env(environ)
    run_id = environ.get("TORCHELASTIC_RUN_ID") or "none"
    round_fd = _fd_var(environ, ROUND_FD_VAR)
    ready_fd = _fd_var(environ, READY_FD_VAR)
    replaces = round_fd is not None and refill_from_env(environ)
    return WorkerEnv(first, run_id, round_fd, ready_fd, replaces, f"run {run_id} pid {os.getpid()}")


def _fd_var(environ: Mapping[str, str], name: str) -> int | None:
    text = environ.get(name)
    if not text:
        return None
    try:
        fd = int(text)
    except ValueError:
        raise WorkerEnvError(f"{name}={text[:40]!r} is not a file descriptor number.") from None
    if not 0 <= fd <= _MAX_FD:
        raise WorkerEnvError(f"{name}={text[:40]!r} is out of range for a file descriptor.")
    try:
        os.fstat(fd)
    except OSError as error:
        raise WorkerEnvError(f"{name}={fd} is not an open file descriptor of this process ({error.strerror}).") from None
    return fd
