"""How this node starts its worker groups, whatever the attempt: one frozen value.

The agent's group factory (:func:`elastic.agent.groups.worker_groups`) makes one
:class:`GroupSettings` per node and hands it to every attempt's
:class:`~elastic.agent.processes.workers.WorkerGroup`; what changes per attempt (the round, the
attempt number, the restart count) is passed beside it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import IO, Mapping

from elastic.agent.prewarm.pool import TemplatePool
from elastic.agent.processes.logs_specs import LogsSpecsHost
from elastic.agent.processes.proctree import ProcessLister
from elastic.agent.worker_env import python_executable
from elastic.config import LaunchConfig

__all__ = ["GroupSettings"]


@dataclass(frozen=True)
class GroupSettings:
    """What every worker group of this node is started with (each None: the default).

    Attributes:
        node_id: this node's id in the rendezvous, naming its log directory (agents may share
            ``--log-dir``).
        log_root: base log directory (from :func:`~elastic.agent.processes.output.resolve_log_root`);
            None: ``config.log_dir`` or a new temporary directory.
        environ: the base environment of workers (default: the agent's ``os.environ``, read when
            a group is made).
        python: the interpreter (default: ``$PYTHON_EXEC`` or ours).
        console_stdout, console_stderr: the console (default: ``sys.stdout``/``sys.stderr``).
        line_prefix_template: torchrun's ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` (default: the
            config's, which the CLI reads from the environment).
        process_lister: the process table a stop reads (default: ``/proc``; tests inject one).
        templates: pre-warmed templates to fork workers from (``--prewarm``); a worker whose
            template cannot serve starts the normal way.
        logs_specs: the ``--logs-specs`` plugin's helper that places the logs (required when
            ``config.logs_specs`` names a plugin; None: our layout).
    """

    node_id: str | None = None
    log_root: str | None = None
    environ: Mapping[str, str] | None = None
    python: str | None = None
    console_stdout: IO | None = None
    console_stderr: IO | None = None
    line_prefix_template: str | None = None
    process_lister: ProcessLister | None = None
    templates: TemplatePool | None = None
    logs_specs: LogsSpecsHost | None = None

    def worker_environ(self) -> dict[str, str]:
        """The base environment of workers, as of now."""
        return dict(os.environ if self.environ is None else self.environ)

    def interpreter(self, environ: Mapping[str, str]) -> str:
        return self.python or python_executable(environ)

    def consoles(self) -> dict[str, IO]:
        """The console streams workers' shown output goes to, by name."""
        return {"stdout": self.console_stdout if self.console_stdout is not None else sys.stdout,
                "stderr": self.console_stderr if self.console_stderr is not None else sys.stderr}

    def prefix_template(self, config: LaunchConfig) -> str | None:
        return config.log_line_prefix_template if self.line_prefix_template is None else self.line_prefix_template

    def templates_for(self, config: LaunchConfig) -> TemplatePool | None:
        """The templates, if they serve ``config``'s entrypoint."""
        return self.templates if self.templates is not None and self.templates.serves(config.entrypoint) else None
