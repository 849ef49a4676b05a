"""The process group backend a live worker forms its groups with, decided once, at start.

Live recovery is built and tested on gloo. Under an agent with ``--live-recovery``, NCCL is
refused in one line unless the worker's environment opts in (``ELASTIC_LIVE_NCCL=1``), because
two things it relies on do not hold there yet: the guard that completes a collective with its
result or an interrupt (:mod:`elastic.worker.guard`) gets NCCL works whose futures complete at
launch (they are CUDA stream futures), so it never sees one fail or hang; and with the agent's
default ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` NCCL's watchdog ends a survivor whose peer died,
the process live recovery exists to keep. docs/live-recovery.md, "NCCL: the design", says what
supporting it takes and what is left to check on GPUs.

:func:`decide_backend` is the pure decision (a case table in ``tests/worker/test_backend.py``);
:func:`choose_backend` probes torch, and on a refusal leaves the reason in the worker's error
file for the agent's report before it raises.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace
from typing import Callable, Mapping

from elastic.worker.errors import UnsupportedBackendError
from elastic.worker.options import LiveOptions

log = logging.getLogger(__name__)

__all__ = ["NCCL_DESIGN", "NCCL_OPT_IN", "BackendChoice", "choose_backend", "decide_backend"]

NCCL_OPT_IN = "ELASTIC_LIVE_NCCL"
"""``1``: let a live worker form NCCL groups anyway (experimental, unverified); ``0`` or unset: refuse."""
NCCL_DESIGN = "docs/live-recovery.md#nccl-the-design"
"""Where a refusal points: what NCCL support takes, and the checklist for GPUs."""
ERROR_FILE_VAR = "TORCHELASTIC_ERROR_FILE"


@dataclass(frozen=True)
class BackendChoice:
    """The backend to form groups with, or why none may be.

    Attributes:
        backend: ``"gloo"`` or ``"nccl"``; None when refused.
        refusal: one line saying why and what to do instead; None when not refused.
        experimental: NCCL taken on the opt-in (warn once).
    """

    backend: str | None
    refusal: str | None = None
    experimental: bool = False


def decide_backend(asked: str | None, live: bool, opt_in: str | None, cuda_available: bool,
                   nccl_built: bool) -> BackendChoice:
    """The backend for ``LiveOptions.backend == asked`` (None: NCCL when CUDA is available, else
    gloo, as ``init_process_group`` users expect); ``live``: the worker has a round pipe (an
    agent with ``--live-recovery``); ``opt_in``: the text of ``ELASTIC_LIVE_NCCL``. Pure.

    Under a live agent NCCL is refused unless opted in (an opt-in other than 1 or 0 is refused
    too: a typo must not pass for a choice). Without one (torchrun, or an agent without
    ``--live-recovery``) the script restarts on a failure as any script would, so NCCL is left
    to torch's own handling. Either way NCCL is refused where it cannot run (torch built without
    it, or no CUDA device), where ``init_process_group`` would fail round after round.
    """
    if asked == "gloo" or (asked is None and not cuda_available):
        return BackendChoice("gloo")
    why = "LiveOptions(backend='nccl') asks for NCCL" if asked == "nccl" else "CUDA is available, so LiveTraining would use NCCL"
    if live and opt_in not in (None, "", "0", "1"):
        return BackendChoice(None, f"{NCCL_OPT_IN}={opt_in[:40]!r} must be 1 (try NCCL under --live-recovery) or 0.")
    if live and opt_in != "1":
        return BackendChoice(None, f"{why}, which live recovery does not support yet: pass "
                                   f"LiveOptions(backend='gloo'), or set {NCCL_OPT_IN}=1 to try NCCL at your own risk "
                                   f"(see {NCCL_DESIGN}).")
    if not nccl_built:
        return BackendChoice(None, f"{why}, but this torch has no NCCL built in: pass LiveOptions(backend='gloo') "
                                   "or install a CUDA build of torch.")
    if not cuda_available:
        return BackendChoice(None, f"{why}, but no CUDA device is available to this worker: pass "
                                   "LiveOptions(backend='gloo') or check CUDA_VISIBLE_DEVICES.")
    return BackendChoice("nccl", experimental=live)


def choose_backend(options: LiveOptions, environ: Mapping[str, str], label: str, live: bool,
                   cuda_available: Callable[[], bool] | None = None,
                   nccl_built: Callable[[], bool] | None = None,
                   clock: Callable[[], float] = time.time) -> LiveOptions:
    """``options`` with the backend decided (:func:`decide_backend`; ``live``: the worker has a
    round pipe); the probes default to torch's.

    Raises:
        UnsupportedBackendError: the backend is refused; its one line (``label``: the run and
            process) is also written to the worker's ``TORCHELASTIC_ERROR_FILE``, if it has one.
    """
    if cuda_available is None or nccl_built is None:
        import torch
        import torch.distributed as dist

        cuda_available = cuda_available or torch.cuda.is_available
        nccl_built = nccl_built or dist.is_nccl_available
    choice = decide_backend(options.backend, live, environ.get(NCCL_OPT_IN), cuda_available(), nccl_built())
    if choice.refusal is not None:
        error = UnsupportedBackendError(f"{label}: {choice.refusal}")
        _write_error_file(environ.get(ERROR_FILE_VAR), error, clock)
        raise error
    if choice.experimental:
        log.warning("%s: forming NCCL groups because %s=1; live recovery on NCCL is experimental and unverified "
                    "(see %s)", label, NCCL_OPT_IN, NCCL_DESIGN)
    return replace(options, backend=choice.backend)


def _write_error_file(path: str | None, error: UnsupportedBackendError, clock: Callable[[], float]) -> None:
    """Leave ``error`` where torch's ``@record`` would (its format, without a traceback), so the
    agent's failure report names it; ``@record`` itself lets a ``SystemExit`` through unwritten.
    Best effort: a file that cannot be written leaves the line on stderr alone."""
    if not path:
        return
    report = {"message": {"message": f"{type(error).__name__}: {error}",
                          "extraInfo": {"py_callstack": "", "timestamp": str(int(clock()))}}}
    try:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(report, out)
    except OSError as problem:
        log.debug("cannot write the error file %s: %s", path, problem)
