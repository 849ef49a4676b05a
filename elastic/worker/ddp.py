"""A DistributedDataParallel whose gradients are averaged over the live group.

Stock DDP talks to its process group directly: a broadcast at construction, a broadcast when it
rebuilds its buckets after the first iteration, one for buffers in every forward. Those calls
block in C++ and would hang on a frozen peer, and a DDP built on one round's group is useless
on the next. So, as TorchFT's DDP does, the module is given a private one-rank group
(those calls become local no-ops) and a comm hook that sends each bucket through
:meth:`~elastic.worker.collectives.GroupInUse.bucket_allreduce` on whatever group is current:
one DDP lives through every re-forming, and a hung bucket is abandoned when the next round arrives.

Consequences, by design:

* ``find_unused_parameters=True`` is forced: it is what stops DDP from rebuilding its buckets
  after the first iteration, which would give a survivor and a joiner different bucket
  layouts. torch's one-time advice to turn it off when no parameter is unused (a C++ warning
  on stderr at the first forward) is spent on a throwaway module first, so it is not printed:
  the flag is ours, not the user's.
* Buffers (BatchNorm statistics) are not broadcast each forward; they travel in the state when
  a rank heals. Put them in ``state_dict()``.
* ``init_sync`` is off: the first heal sends rank 0's state to everyone (``LiveOptions.init_sync``).

The private group runs no thread (torch's ``FakeProcessGroup``, whose collectives are the
identity of a one-rank group): a gloo one ran two worker threads and a socket loop for as long
as the DDP lived, and a DDP sits in reference cycles, so with a module-level ``ddp`` or the
garbage collector off they were still running while the interpreter finalized, where a gloo
thread that drops the last work of a backward pass aborts the process (the exit race of
``examples/train_ddp.py``). A torch without that backend gets a one-rank gloo group instead.

Users who prefer stock DDP on :attr:`LiveTraining.group` can rebuild it in ``on_reform``; its
own collectives then wait for the collective timeout on a frozen peer.
"""

from __future__ import annotations

import os
import sys
import threading
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from elastic.worker.errors import LiveRecoveryError


__all__ = ["live_ddp", "local_group", "spend_unused_parameters_warning"]

class BucketReducer(Protocol):
    """What a live DDP needs (of :class:`~elastic.worker.collectives.GroupInUse`): the
    all-reduce of one gradient bucket on whatever group is current (a future of the reduced tensor)."""

    def bucket_allreduce(self, buffer: torch.Tensor) -> torch.futures.Future: ...


_FORCED = ("process_group", "init_sync", "find_unused_parameters", "device_mesh")


def local_group() -> dist.ProcessGroup:
    """A one-rank process group private to this process (no network, no store peers, no thread):
    torch's ``FakeProcessGroup`` as its backend, or gloo on a torch without it.

    Raises:
        LiveRecoveryError: this torch's private API for building a group changed.
    """
    store = dist.HashStore()
    try:
        group = dist.ProcessGroup(store, 0, 1)
        backend, kind = _threadless_backend()
        if backend is None:
            backend, kind = dist.ProcessGroupGloo(store, 0, 1, timedelta(seconds=60)), dist.ProcessGroup.BackendType.GLOO
        group._set_default_backend(kind)
        group._register_backend(torch.device("cpu"), kind, backend)
        if torch.cuda.is_available():
            group._register_backend(torch.device("cuda"), kind, backend)
    except (AttributeError, TypeError, RuntimeError) as error:
        raise LiveRecoveryError(f"cannot build a local process group with torch {torch.__version__}: {error}") from error
    return group


def _threadless_backend() -> tuple[Any, Any]:
    """torch's one-rank ``FakeProcessGroup`` and its backend type, or (None, None) where this
    torch has none (then the caller falls back to gloo, threads and all)."""
    try:
        from torch._C._distributed_c10d import FakeProcessGroup

        return FakeProcessGroup._create_internal(0, 1), dist.ProcessGroup.BackendType.CUSTOM
    except (ImportError, AttributeError, TypeError, RuntimeError):
        return None, None


_warning_spent = threading.Event()
_spending = threading.Lock()


def spend_unused_parameters_warning() -> None:
    """Spend torch's once-per-process "find_unused_parameters=True was specified in DDP
    constructor, but did not find any unused parameters" warning on a throwaway one-parameter
    DDP, with stderr (fd 2) sent to /dev/null for that one forward.

    The warning is a C++ ``TORCH_WARN_ONCE`` that torch's logger writes straight to fd 2 at the
    first forward that finds every parameter used, so Python's warning filters never see it.
    Best effort: if the throwaway DDP cannot be built, the warning may appear later.
    """
    with _spending:
        if _warning_spent.is_set():
            return
        _warning_spent.set()
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            with open(os.devnull, "wb") as null:
                os.dup2(null.fileno(), 2)
                try:
                    probe = DistributedDataParallel(torch.nn.Linear(1, 1), process_group=local_group(),
                                                    init_sync=False, find_unused_parameters=True)
                    probe(torch.zeros(1, 1))
                except (RuntimeError, LiveRecoveryError):
                    pass
                finally:
                    os.dup2(saved, 2)
        finally:
            os.close(saved)


def _hook(live, bucket):  # unannotated: DDP checks the annotations' values, which postponed evaluation makes strings
    return live.bucket_allreduce(bucket.buffer())


def live_ddp(live: BucketReducer, module: torch.nn.Module, **kwargs: Any) -> DistributedDataParallel:
    """Wrap ``module`` in a DDP whose buckets go through ``live``.

    Raises:
        ValueError: ``kwargs`` sets one of the arguments this wrapper fixes.
    """
    fixed = sorted(set(kwargs) & set(_FORCED))
    if fixed:
        raise ValueError(f"live_ddp() sets {', '.join(fixed)} itself; leave them out.")
    spend_unused_parameters_warning()
    ddp = DistributedDataParallel(module, process_group=local_group(), init_sync=False, find_unused_parameters=True, **kwargs)
    ddp.register_comm_hook(live, _hook)
    return ddp
