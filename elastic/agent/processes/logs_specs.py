"""``--logs-specs NAME``: a torchrun ``LogsSpecs`` plugin decides where each rank's output goes.

torchrun loads the class registered as ``NAME`` in the ``torchrun.logs_specs`` entry-point group,
constructs it once with ``log_dir``, ``redirects``, ``tee`` and ``local_ranks_filter``, and before
each attempt calls ``reify(envs)``, which returns a ``LogsDest`` (per local rank: the stdout and
stderr paths, ``""`` for the console and ``os.devnull`` for nowhere; the tee'd ones; the error
files) and may set variables in ``envs``. The class imports torch and the agent must not, so one
helper process per agent (:class:`LogsSpecsHost`, the workers' interpreter) loads and keeps the
plugin, as torchrun keeps its instance; the agent sends it each attempt's environments and gets
the destinations back as JSON lines (never pickle), which :mod:`.output` routes.

Why not the store helper (:mod:`.store_host`), which imports torch too: it serves one socket
protocol and exists only for store-backed backends (not for a static node), and a plugin that
prints or hangs would take the workers' store with it. The helper is started with the launch,
and the runner waits for the plugin's construction before joining the rendezvous, so a plugin
that fails to load is one line before this node joins anything, as under torchrun.
"""

from __future__ import annotations

import json
import logging
import queue
import subprocess
import threading
from dataclasses import dataclass
from typing import IO, Mapping

from elastic.agent.errors import AgentError
from elastic.agent.pdeathsig import parent_death_preexec
from elastic.agent.processes.output import RankDest
from elastic.agent.safe_path import isolated_program
from elastic.config import LaunchConfig, StdMask

log = logging.getLogger(__name__)

__all__ = ["LOGS_SPECS_GROUP", "LogsPlan", "LogsSpecsError", "LogsSpecsHost", "logs_specs_host"]

LOGS_SPECS_GROUP = "torchrun.logs_specs"
READY_TIMEOUT_S = 120.0
"""How long the helper may take to import torch and construct the plugin (a loaded host is slow)."""
REIFY_TIMEOUT_S = 60.0
"""How long one ``reify`` may take."""
_STOP_TIMEOUT_S = 2.0
"""How long a ready helper gets to exit once its stdin closes, before it is killed."""

# The helper, run as ``python -c`` by the workers' interpreter (which has torch; it may not have
# our package), behind :func:`isolated_program` (nothing is imported from the agent's working
# directory; the plugin comes from its installed entry point). argv[1]: the settings as JSON. Replies on its stdout, one JSON object per line;
# anything the plugin prints goes to stderr instead. Requests on stdin: one {rank: env} per line.
_HELPER = r"""
import json, os, sys
channel = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)

def reply(message):
    channel.write(json.dumps(message) + "\n")
    channel.flush()

def failure(error):
    return {"error": ("%s: %s" % (type(error).__name__, error))[:500]}

try:
    settings = json.loads(sys.argv[1])
    from importlib import metadata
    from torch.distributed.elastic.multiprocessing.api import LogsSpecs, Std
    points = [p for p in metadata.entry_points(group=settings["group"]) if p.name == settings["name"]]
    if not points:
        raise LookupError("no entry point %r in the %s group of %s" % (settings["name"], settings["group"],
                                                                      sys.executable))
    cls = points[0].load()
    if not (isinstance(cls, type) and issubclass(cls, LogsSpecs)):
        raise TypeError("%s is not a LogsSpecs subclass" % points[0].value)

    def std(mask):
        if not mask["per_rank"]:
            return Std(mask["default"])
        return {int(rank): Std(value) for rank, value in mask["per_rank"].items()}

    ranks = settings["local_ranks_filter"]
    specs = cls(log_dir=settings["log_dir"], redirects=std(settings["redirects"]), tee=std(settings["tee"]),
                local_ranks_filter=set(ranks) if ranks is not None else None)
    reply({"ready": str(specs.root_log_dir)})
except BaseException as error:
    reply(failure(error))
    sys.exit(0)
for line in sys.stdin:
    try:
        envs = {int(rank): env for rank, env in json.loads(line).items()}
        dest = specs.reify(envs)
        reply({"stdouts": dest.stdouts, "stderrs": dest.stderrs, "tee_stdouts": dest.tee_stdouts,
               "tee_stderrs": dest.tee_stderrs, "error_files": dest.error_files, "envs": envs})
    except BaseException as error:
        reply(failure(error))
sys.stderr.flush()
os._exit(0)  # EOF: the agent is done; tearing down torch would hold its exit a few tenths of a second
"""


class LogsSpecsError(AgentError, RuntimeError):
    """The ``--logs-specs`` plugin could not be loaded, constructed or asked (the message says why)."""


@dataclass(frozen=True)
class LogsPlan:
    """One attempt's destinations from the plugin: per local rank, where its streams go and the
    variables the plugin set or changed in its environment (``TORCHELASTIC_ERROR_FILE``, ...)."""

    dests: Mapping[int, RankDest]
    env: Mapping[int, Mapping[str, str]]
    root_log_dir: str


class LogsSpecsHost:
    """The helper process that holds one plugin instance for the agent's life.

    Args:
        name: the entry point's name (``--logs-specs``).
        python: the workers' interpreter (it has torch and the plugin).
        environ: the helper's environment.
        log_dir, redirects, tee, local_ranks_filter: what torchrun constructs the plugin with.
    """

    def __init__(self, name: str, python: str, environ: Mapping[str, str], *, log_dir: str | None,
                 redirects: StdMask, tee: StdMask, local_ranks_filter: frozenset[int] | None) -> None:
        self.name = name
        self._python = python
        self._environ = dict(environ)
        self._settings = _settings(name, log_dir, redirects, tee, local_ranks_filter)
        self._proc: subprocess.Popen | None = None
        self._replies: queue.Queue[dict | None] = queue.Queue()
        self._lock = threading.Lock()
        self._root_log_dir: str | None = None
        self._failed: str | None = None
        self.closed = False

    def start(self) -> None:
        """Start the helper in the background (idempotent); it imports torch and builds the plugin.

        Raises:
            LogsSpecsError: the interpreter could not be started.
        """
        with self._lock:
            if self._proc is not None or self.closed:
                return
            try:
                self._proc = subprocess.Popen(
                    [self._python, "-c", isolated_program(_HELPER), json.dumps(self._settings)], env=self._environ,
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
                    preexec_fn=parent_death_preexec(),  # dies with the agent
                )
            except OSError as error:
                raise LogsSpecsError(f"--logs-specs {self.name}: cannot start {self._python}: {error}") from error
            threading.Thread(target=self._read, args=(self._proc.stdout,), name="logs-specs-replies",
                             daemon=True).start()

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> str:
        """Wait until the plugin is constructed; returns its ``root_log_dir``.

        Raises:
            LogsSpecsError: it could not be loaded or constructed (the plugin's own error), the
                helper died, or it was not ready within ``timeout``.
        """
        self.start()
        with self._lock:
            if self.closed:
                self._failed = self._failed or "the helper was closed"
            if self._root_log_dir is None and self._failed is None:
                reply = self._next_reply(timeout, "load the plugin")
                if "ready" in reply:
                    self._root_log_dir = reply["ready"]
                else:
                    self._failed = reply["error"]
            if self._failed is not None:
                raise LogsSpecsError(f"--logs-specs {self.name}: {self._failed}")
            return self._root_log_dir  # type: ignore[return-value]

    def reify(self, envs: Mapping[int, Mapping[str, str]], timeout: float = REIFY_TIMEOUT_S) -> LogsPlan:
        """The plugin's destinations for one attempt; ``envs`` are the variables the launcher sets
        for each local rank (what torchrun hands ``reify``).

        Raises:
            LogsSpecsError: the plugin failed or answered without a destination for every rank.
        """
        root = self.wait_ready()
        with self._lock:
            try:
                self._proc.stdin.write((json.dumps({str(rank): dict(env) for rank, env in envs.items()}) + "\n")
                                       .encode())
                self._proc.stdin.flush()
            except (OSError, ValueError) as error:
                raise LogsSpecsError(f"--logs-specs {self.name}: the helper is gone ({error})") from error
            reply = self._next_reply(timeout, "reify")
        if "error" in reply:
            raise LogsSpecsError(f"--logs-specs {self.name}: reify failed: {reply['error']}")
        return _plan(reply, envs, root, self.name)

    def close(self) -> None:
        """Stop the helper and reap it (idempotent). A helper that has not been found ready
        (still importing torch) is killed at once; a ready one reads EOF and exits, or is killed
        after 2 s."""
        self.closed = True
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if self._root_log_dir is None:
            proc.kill()  # mid-import, or failed: the agent's exit must not wait out the import
        try:
            proc.stdin.close()
            proc.wait(timeout=_STOP_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            try:
                self._replies.put(json.loads(line))
            except ValueError:
                log.warning("--logs-specs %s: the helper sent a line that is not JSON: %.200r", self.name, line)
        self._replies.put(None)

    def _next_reply(self, timeout: float, what: str) -> dict:
        """The helper's next reply; a helper that is late or gone fails this host for good (a late
        reply would answer the next request)."""
        try:
            reply = self._replies.get(timeout=timeout)
        except queue.Empty:
            self._failed = f"the helper did not {what} within {timeout:g}s"
        else:
            if reply is not None:
                return reply
            self._failed = f"the helper exited (can {self._python} import torch?)"
        self.close()
        raise LogsSpecsError(f"--logs-specs {self.name}: {self._failed}")


def _settings(name: str, log_dir: str | None, redirects: StdMask, tee: StdMask,
              local_ranks_filter: frozenset[int] | None) -> dict:
    """What the helper constructs the plugin with, as JSON-ready values."""
    def mask(value: StdMask) -> dict:
        return {"default": int(value.default), "per_rank": {str(r): int(std) for r, std in value.per_rank.items()}}

    return {"group": LOGS_SPECS_GROUP, "name": name, "log_dir": log_dir, "redirects": mask(redirects),
            "tee": mask(tee), "local_ranks_filter": sorted(local_ranks_filter) if local_ranks_filter else None}


def _plan(reply: dict, sent: Mapping[int, Mapping[str, str]], root: str, name: str) -> LogsPlan:
    """The reply of one ``reify`` as destinations, with the variables the plugin changed.

    Raises:
        LogsSpecsError: a local rank has no stdout or stderr destination (torch refuses that too).
    """
    dests, env = {}, {}
    for rank in sent:
        key = str(rank)
        if key not in reply["stdouts"] or key not in reply["stderrs"]:
            raise LogsSpecsError(f"--logs-specs {name}: reify gave no stdout or stderr for local rank {rank}")
        dests[rank] = RankDest(
            stdout=reply["stdouts"][key], stderr=reply["stderrs"][key], tee_stdout=key in reply["tee_stdouts"],
            tee_stderr=key in reply["tee_stderrs"], error_file=reply["error_files"].get(key, ""),
        )
        changed = reply["envs"].get(key, {})
        env[rank] = {var: str(value) for var, value in changed.items() if sent[rank].get(var) != value}
    return LogsPlan(dests, env, root)


def logs_specs_host(config: LaunchConfig, environ: Mapping[str, str], python: str) -> LogsSpecsHost:
    """The helper for ``config``'s plugin (not started). The runner makes one per launch, as
    torchrun constructs one ``LogsSpecs``, and hands it to the agent: every attempt's worker
    group reifies through it.

    Raises:
        ValueError: ``config`` names no plugin.
    """
    if not config.logs_specs:
        raise ValueError("The launch config names no --logs-specs plugin.")
    return LogsSpecsHost(config.logs_specs, python, environ, log_dir=config.log_dir, redirects=config.redirects,
                         tee=config.tee, local_ranks_filter=config.local_ranks_filter)
