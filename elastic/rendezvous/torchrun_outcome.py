"""What the torchrun plugin learns from torch's agent about the job: its command and its end.

torch's ``RendezvousParameters`` carry neither the entrypoint nor whether the node's workers
succeeded, so the plugin (:mod:`elastic.rendezvous.torchrun_plugin`) reads them where torch
2.13 leaves them:

* **The command** (the job's fingerprint, :mod:`elastic.rendezvous.job`): torchrun's own
  ``sys.argv``, parsed by torchrun's own parser (``torch.distributed.run.parse_args``), when
  this process is torchrun (``torchrun`` or ``python -m torch.distributed.run``). Anywhere else
  (``elastic_launch`` from a program) there is no command to read: only
  ``--rdzv-conf job_fingerprint`` identifies the job, and without it nothing is checked.
* **The workers' success, before the exit barrier**: torch's agent calls its exit barrier
  only when the node's workers all succeeded (``SimpleElasticAgent._invoke_run``), and the
  barrier's first operation is ``store.add("torchelastic/agent/terminal_state/num_members")``
  on the store the plugin handed out. :class:`AgentStore` wraps that store and reports the
  first such ``add``: the moment elasticrun declares the job finished. The barrier's wait
  (``store.wait([".../last_member"])``) then runs our exit barrier instead of the counter's:
  torch's counter waits the whole ``exit_barrier_timeout`` (300 s) for a member that will never
  arrive (its workers failed after ours finished, and it left), ours ends when every member is
  done or one left without being done (:mod:`elastic.rendezvous.barrier`), as elasticrun's.
* **The workers' success, after**: ``launch_agent`` calls the handler's ``shutdown()`` from a
  ``finally`` that an exception passes through on every failure (``ChildFailedError`` for
  failed workers, ``AttributeError`` from torch 2.13's graceful-exit path, ``SystemExit``), and
  not on success: :func:`leaving_after_success` (``sys.exc_info()`` is empty) is the fallback
  should a torch version's barrier not pass through :class:`AgentStore`.
"""

from __future__ import annotations

import logging
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Callable, Sequence

import torch.distributed as dist

from elastic.rendezvous.errors import JobFinishedError, JobMismatchError
from elastic.rendezvous.job import JobIdentity, arrival_outcome, job_identity

__all__ = ["EXIT_BARRIER_PREFIX", "AgentStore", "leaving_after_success", "leaving_line", "torchrun_job"]

log = logging.getLogger(__name__)

EXIT_BARRIER_PREFIX = "torchelastic/agent/terminal_state"
"""torch's ``_TERMINAL_STATE_SYNC_ID``: the key prefix of its agents' exit barrier."""


class AgentStore(dist.Store):
    """The agent store torch's agent gets: every call goes to ``inner``, except the exit barrier's.

    The first ``add`` of the exit barrier calls ``on_exit_barrier`` first (once; it must not
    raise); a ``wait`` of the exit barrier calls ``exit_barrier(seconds)`` instead of waiting on
    ``inner`` (it returns when the barrier is over, whatever its outcome; it must not raise).
    ``store.timeout`` is this wrapper's own (torch's ``store_timeout`` sets it around the
    barrier): waits without a timeout use it, as the inner store would its own.
    """

    def __init__(self, inner: dist.Store, on_exit_barrier: Callable[[], None],
                 exit_barrier: Callable[[float], None]) -> None:
        super().__init__()
        self._inner = inner
        self._on_exit_barrier = on_exit_barrier
        self._exit_barrier = exit_barrier
        self._barrier_seen = threading.Event()
        self.set_timeout(inner.timeout)

    def add(self, key: str, value: int) -> int:
        if key.startswith(EXIT_BARRIER_PREFIX) and not self._barrier_seen.is_set():
            self._barrier_seen.set()
            self._on_exit_barrier()
        return self._inner.add(key, value)

    def set(self, key: str, value) -> None:
        self._inner.set(key, value)

    def get(self, key: str) -> bytes:
        return self._inner.get(key)

    def compare_set(self, key: str, expected, desired) -> bytes:
        return self._inner.compare_set(key, expected, desired)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        limit = self.timeout if timeout is None else timeout
        if keys and all(key.startswith(EXIT_BARRIER_PREFIX) for key in keys):
            self._exit_barrier(limit.total_seconds())
            return
        self._inner.wait(keys, limit)

    def check(self, keys: list[str]) -> bool:
        return self._inner.check(keys)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._inner.multi_get(keys)

    def multi_set(self, keys: list[str], values: list) -> None:
        self._inner.multi_set(keys, values)

    def delete_key(self, key: str) -> bool:
        return self._inner.delete_key(key)

    def num_keys(self) -> int:
        return self._inner.num_keys()


def leaving_after_success() -> bool:
    """Whether the handler's ``shutdown()`` runs in ``launch_agent``'s ``finally`` after the
    agent succeeded: no exception is passing through (see the module docstring)."""
    return sys.exc_info()[0] is None


def leaving_line(cause: BaseException | None, included: bool, already_finished_ok: bool = False) -> tuple[str, int] | None:
    """The one line and exit code with which torchrun ends when a join meets ``cause`` (our
    error behind torch's), or None when torch's agent should handle it.

    The job finished (another node's workers all succeeded): exit 0 without training again
    when this node's workers ran before (``included``) or it waited to join; a node that
    arrived after the end exits :data:`~elastic.rendezvous.job.ALREADY_FINISHED_EXIT_CODE`
    (0 with ``already_finished_ok``), as under elasticrun
    (:func:`~elastic.rendezvous.job.arrival_outcome`). Another job owns the run id: exit 1, bad
    input, one line. By ``SystemExit``, because torch 2.13's agent turns its own
    ``RendezvousGracefulExitError`` into an ``AttributeError`` (``run()`` returns None to
    ``launch_agent``) and any other rendezvous error into exit 1 with a traceback.
    """
    if isinstance(cause, JobMismatchError):
        return str(cause), 1
    if not isinstance(cause, JobFinishedError):
        return None
    if included:
        return (f"the job finished on node {cause.node_id} in round {cause.round}; this node's workers failed or "
                "stopped after that, most likely because their peers left: not training again"), 0
    outcome = arrival_outcome(cause.node_id, cause.round, cause.joined, already_finished_ok)
    return outcome.line, outcome.exit_code


def torchrun_job(argv: Sequence[str], explicit: str = "") -> JobIdentity | None:
    """The job of this torchrun process, from its command line ``argv`` (``sys.argv``), or from
    ``explicit`` alone (``job_fingerprint``) when the process is not torchrun; None: neither."""
    command = _torchrun_command(argv)
    if command is not None:
        return job_identity(*command, explicit=explicit or None)
    if explicit:
        return job_identity("script", "(command unknown: not run by torchrun)", [], explicit)
    return None


def _torchrun_command(argv: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """``(kind, entrypoint, args)`` from torchrun's argv, or None when this is not torchrun."""
    if not argv:
        return None
    launcher = Path(argv[0])
    if launcher.name != "torchrun" and launcher.parts[-3:] != ("torch", "distributed", "run.py"):
        return None
    from torch.distributed.run import parse_args

    try:
        args = parse_args(list(argv[1:]))
    except SystemExit:  # cannot happen: torchrun parsed the same argv to get here
        log.warning("Cannot read the job's command from torchrun's arguments; the job is not fingerprinted")
        return None
    kind = "module" if args.module else "command" if args.no_python else "run_path" if args.run_path else "script"
    return kind, args.training_script, list(args.training_script_args)
