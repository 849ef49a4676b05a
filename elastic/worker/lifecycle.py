"""A live worker's lifecycle: what may happen before its start (a checkpoint restored), the checks
at its start (:meth:`Lifecycle.open`), whether it is open for steps, and its close, once, at the
latest at the interpreter's exit.

The facade (:class:`~elastic.worker.live.LiveTraining`) forms the first round itself once
:meth:`Lifecycle.open` returned, so the options it keeps are the chosen ones while it forms.
"""

from __future__ import annotations

import atexit
from typing import Any, Mapping

import torch.distributed as dist

from elastic.worker.assembly import LiveParts
from elastic.worker.backend import choose_backend
from elastic.worker.codec import check_state
from elastic.worker.decisions import Mark
from elastic.worker.errors import LiveRecoveryError
from elastic.worker.options import LiveOptions

__all__ = ["Lifecycle"]


class Lifecycle:
    """Started once, closed once, of one live worker's parts; closed at exit if the program did not."""

    def __init__(self, parts: LiveParts) -> None:
        self._parts = parts
        self.started = False
        self.closed = False

    def is_open(self) -> bool:
        """Whether steps may run: started and not closed."""
        return self.started and not self.closed

    def restore(self, checkpoint: Any) -> None:
        """Load a checkpoint of the whole state and stand at its step, before the start.

        Raises:
            LiveRecoveryError: started already (the heals keep the ranks level from then on).
            StateTransferError: the checkpoint does not fit what this worker registered.
        """
        if self.started:
            raise LiveRecoveryError(f"{self._parts.env.label}: load_state_dict() restores a checkpoint before start(); "
                                    "after it, the heals keep the ranks level.")
        step = self._parts.training.apply(checkpoint, "the checkpoint")
        self._parts.commits.adopt(Mark(step))  # committed in no round of this run's numbering

    def open(self, options: LiveOptions) -> LiveOptions:
        """Check that the worker may start, have the recoverer form with the backend chosen, mark
        the worker started and close it at exit; returns the options to form with.

        Raises:
            LiveRecoveryError: started already, or the default process group exists.
            UnsupportedBackendError: see :func:`~elastic.worker.backend.choose_backend`.
            StateTransferError: the whole state holds a value that cannot be sent.
        """
        parts = self._parts
        options = _check_start(self.started, options, parts.environ, parts.env.has_pipe, parts.env.label)
        _import_group_defaults()
        parts.recoverer.use_options(options)
        check_state(parts.whole_state())
        self.started = True
        atexit.register(self.close)
        return options

    def close(self) -> None:
        """Close the recoverer once (leave the group, stop watching the pipe, drain)."""
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self.close)
        self._parts.recoverer.close()


def _import_group_defaults() -> None:
    """Import ``torch.distributed.nn`` while no default process group exists.

    Its functions take ``group=group.WORLD`` as a default, evaluated at its import: the default
    group of that moment, kept for the life of the process. DDP's construction (``live.ddp()``)
    imports it, after the first round's group formed, unless something imported it before; that
    group then outlived its ``destroy_process_group()``, threads and sockets running while the
    interpreter finalized (where a gloo thread dropping the last work of a backward pass aborts
    the process). Imported here, the defaults are None, whatever the program imports.
    """
    import torch.distributed.nn  # noqa: F401


def _check_start(started: bool, options: LiveOptions, environ: Mapping[str, str], live: bool,
                 label: str) -> LiveOptions:
    """The options to form with (the backend chosen, :func:`~elastic.worker.backend.choose_backend`).

    Raises:
        LiveRecoveryError: started already, or the default process group exists.
        UnsupportedBackendError: see :func:`~elastic.worker.backend.choose_backend`.
    """
    if started:
        raise LiveRecoveryError(f"{label}: start() was called twice.")
    options = choose_backend(options, environ, label, live=live)
    if dist.is_initialized():
        raise LiveRecoveryError(f"{label}: the default process group is already initialized; "
                                "LiveTraining forms it itself (remove the init_process_group call).")
    return options
