"""Whether a worker template may be forked: nothing in it that a fork would leave broken.

A fork copies only the calling thread. Whatever another thread was doing (holding a lock,
driving a CUDA context, serving a thread pool) is frozen mid-way in the child. So a template is
accepted only when, after the user's modules are imported:

* no CUDA context exists (``torch.cuda.is_initialized()`` when torch is imported);
* Python runs no thread but the main one (``threading.enumerate()``);
* no OS thread survives a trial fork (``/proc/self/task`` counted in the parent right after a
  fork whose child exits at once).

Why the third rule counts *after* a fork: ``import torch`` alone leaves one idle OS thread here,
OpenBLAS's ``blas_thread_server`` (numpy's bundled OpenBLAS, which torch imports). OpenBLAS
registers a ``pthread_atfork`` handler that stops its pool before every fork and restarts it
lazily on the next BLAS call, so the fork itself runs single-threaded (the parent shows 1 task
after it, the child 1). A thread that no atfork handler stops (a C extension's pthread, a used
OpenMP pool) is still there after the trial fork, and the template is refused. docs/internals.md has
the evidence.

:func:`judge_template` is the pure decision; :func:`probe_template` collects its input inside the
template process. Stdlib only: the template imports this before the user's modules.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from typing import Callable

__all__ = ["TemplateProbe", "judge_template", "probe_template"]


@dataclass(frozen=True)
class TemplateProbe:
    """What a template looked like once its modules were imported.

    Attributes:
        cuda_initialized: ``torch.cuda.is_initialized()``; None when torch is not imported.
        python_threads: names of the Python threads other than the main one.
        os_threads_before_fork: tasks in ``/proc/self/task`` before the trial fork (information).
        os_threads_after_fork: tasks right after the trial fork, in the parent; None where the
            platform has no ``/proc`` (then only the other rules apply).
    """

    cuda_initialized: bool | None
    python_threads: tuple[str, ...]
    os_threads_before_fork: int | None
    os_threads_after_fork: int | None


def judge_template(probe: TemplateProbe) -> str | None:
    """Why the template must not be forked (one line), or None when it may be.

    Each reason names what the template did and what to change: a module named in
    ``--prewarm-modules`` that initialises CUDA or starts threads at import cannot be pre-warmed.
    """
    reasons = []
    if probe.cuda_initialized:
        reasons.append("CUDA is initialised (a CUDA context does not survive a fork)")
    if probe.python_threads:
        reasons.append(f"Python threads are running ({', '.join(sorted(probe.python_threads))})")
    if probe.os_threads_after_fork is not None and probe.os_threads_after_fork > 1:
        reasons.append(f"{probe.os_threads_after_fork - 1} OS thread(s) outlive a fork "
                       "(a C extension's threads or a used OpenMP pool)")
    if not reasons:
        return None
    return "; ".join(reasons) + "; import fewer modules in --prewarm-modules, or run without --prewarm"


def _task_count() -> int | None:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def _cuda_initialized() -> bool | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    cuda = getattr(torch, "cuda", None)
    probe = getattr(cuda, "is_initialized", None)
    return bool(probe()) if probe is not None else None


def probe_template(
    *,
    cuda_initialized: Callable[[], bool | None] = _cuda_initialized,
    task_count: Callable[[], int | None] = _task_count,
    fork: Callable[[], int] = os.fork,
) -> TemplateProbe:
    """Look at this process, doing one trial fork (the child exits at once with ``_exit``).

    Raises:
        OSError: the trial fork failed.
    """
    main = threading.main_thread()
    others = tuple(t.name for t in threading.enumerate() if t is not main)
    before = task_count()
    pid = fork()
    if pid == 0:  # the trial child: touch nothing
        os._exit(0)
    after = task_count()
    os.waitpid(pid, 0)
    return TemplateProbe(cuda_initialized(), others, before, after)
