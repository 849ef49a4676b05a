"""Pre-warmed worker templates (``--prewarm``): a worker start costs a fork, not an interpreter start.

The agent keeps, per local rank, a template process (:mod:`elastic.agent.prewarm.template`) that
has started Python and imported ``--prewarm-modules`` (default torch) with the worker
environment's fixed part (:func:`~elastic.agent.worker_env.fixed_worker_env`). To start a
worker, :meth:`Template.fork` sends the attempt's environment, argv, working directory and the
worker's stdout/stderr descriptors (``SCM_RIGHTS``); the template forks, and the child becomes
the worker. The agent drives it through :class:`ForkedWorker`, which looks like the
``subprocess.Popen`` the rest of the agent knows (``pid``, ``poll``, ``wait``, ``returncode``,
``send_signal``, ``kill``, piped ``stdout``/``stderr``).

A template serves every attempt of the job: a fork leaves it unchanged, so re-using it costs
nothing, while replacing it would cost a fresh import competing for CPU with the new workers.
Only a template that died is replaced, started in the background at the next start (which
starts that worker the normal way). A template that is refused (CUDA initialised, threads
running: :mod:`elastic.agent.prewarm.check`) or cannot import its modules is reported once
and its rank starts normally from then on. Templates are the agent's children, in their own
sessions, with the parent-death signal: start the pool from the agent's main thread.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Mapping

from elastic.agent.errors import TemplateError
from elastic.agent.prewarm.control import Template, TemplateSpec, TemplateState
from elastic.agent.prewarm.forked import ForkedWorker
from elastic.agent.prewarm.wire import ENTRYPOINT_KINDS, WorkerJob
from elastic.agent.worker_env import fixed_worker_env
from elastic.config import Entrypoint, LaunchConfig

__all__ = ["TemplatePool", "worker_path0"]

log = logging.getLogger(__name__)

# How long a start waits for a template still importing (it began before the rendezvous, so
# waiting is never slower than starting a fresh interpreter).
READY_TIMEOUT_S = 120.0


def worker_path0(entrypoint: Entrypoint, cwd: str) -> str:
    """``sys.path[0]`` of ``python -u`` running ``entrypoint`` from ``cwd``: the script's real
    directory, the working directory for ``-m``, ``''`` for ``-c`` (``--run-path``)."""
    if entrypoint.kind == "script":
        return os.path.dirname(os.path.realpath(os.path.join(cwd, entrypoint.target)))
    if entrypoint.kind == "module":
        return cwd
    return ""


class TemplatePool:
    """One template per local rank for the agent's lifetime (``--prewarm``).

    Args:
        config: the launch configuration (entrypoint, nproc, ``--prewarm-modules``).
        environ: the workers' base environment.
        python: the workers' interpreter.
        cwd: the workers' working directory (default: the agent's).
        ready_timeout: how long a start waits for a template still importing.
    """

    def __init__(self, config: LaunchConfig, environ: Mapping[str, str], python: str, *,
                 cwd: str | None = None, ready_timeout: float = READY_TIMEOUT_S) -> None:
        self.config = config
        self.cwd = cwd or os.getcwd()
        self._environ = dict(environ)
        self._python = python
        self._ready_timeout = ready_timeout
        self._templates: dict[int, Template | None] = {}
        self._path0 = worker_path0(config.entrypoint, self.cwd)

    @staticmethod
    def serves(entrypoint: Entrypoint) -> bool:
        """Whether workers of this entrypoint can be forked from a template."""
        return entrypoint.kind in ENTRYPOINT_KINDS

    def start(self) -> None:
        """Start a template per local rank (from the main thread: see lifeline.py)."""
        if not self.serves(self.config.entrypoint):
            return
        for local_rank in range(self.config.nproc_per_node):
            self._templates[local_rank] = self._new(local_rank)

    def wait_ready(self, timeout: float) -> bool:
        """Wait until no template is still importing, at most ``timeout`` seconds in all;
        whether every one is ready (refused or dead ones are reported at their first fork)."""
        deadline = time.monotonic() + timeout
        states = [template.wait_ready(max(deadline - time.monotonic(), 0.0))
                  for template in self._templates.values() if template is not None]
        return all(state is TemplateState.READY for state in states)

    def job(self, env: Mapping[str, str], args: list[str]) -> WorkerJob:
        """The job of one worker with the attempt's environment and substituted args."""
        entry = self.config.entrypoint
        return WorkerJob(entry.kind, entry.target, tuple(args), dict(env), self.cwd, self._path0)

    def fork(self, local_rank: int, job: WorkerJob, stdio: Mapping[str, object], argv: list[str],
             inherited: tuple[int, ...] = ()) -> ForkedWorker | None:
        """A worker forked from ``local_rank``'s template, or None (after one warning line) when
        that worker must start the normal way. A dead template is replaced in the background."""
        template = self._templates.get(local_rank)
        if template is None:
            return None
        state = template.wait_ready(self._ready_timeout)
        if state is TemplateState.READY:
            try:
                return template.fork(job, stdio, argv=argv, inherited=inherited)
            except TemplateError as error:
                state = template.state
                if state is not TemplateState.DEAD:  # a dead one is reported below, once
                    log.warning("%s; starting the worker normally.", error)
                    return None
        if state is TemplateState.STARTING:
            log.warning("%s: the worker template is not ready after %.0fs; starting the worker normally.",
                        template.label, self._ready_timeout)
            return None
        if state is TemplateState.REFUSED:
            log.warning("%s: the worker template was refused: %s; this rank starts normally from now on.",
                        template.label, template.reason)
            self._templates[local_rank] = None
            template.close()
            return None
        log.warning("%s: the worker template died (%s); starting the worker normally and a new template "
                    "in the background.", template.label, template.reason)
        template.close(timeout=0.5)
        self._templates[local_rank] = self._new(local_rank)
        return None

    def templates(self) -> dict[int, Template]:
        """Local rank → its live template."""
        return {rank: t for rank, t in self._templates.items() if t is not None}

    def close(self) -> None:
        """Stop every template."""
        for local_rank, template in list(self._templates.items()):
            if template is not None:
                template.close()
            self._templates[local_rank] = None

    def _new(self, local_rank: int) -> Template | None:
        spec = TemplateSpec(self._python, self.config.prewarm_modules,
                            fixed_worker_env(self._environ, self.config, local_rank), self._path0)
        label = f"Run {self.config.run_id} local rank {local_rank}"
        try:
            return Template(spec, label).start()
        except TemplateError as error:
            log.warning("%s; this rank starts normally.", error)
            return None
