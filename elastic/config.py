"""The launcher's resolved configuration: what ``elasticrun`` was asked to do.

:class:`LaunchConfig` is produced by the pure ``config_from_args(argv, environ)`` in
:mod:`elastic.launch.cli` and consumed by the runner and the agent. Its rendezvous part is
typed: the engine's :class:`~elastic.rendezvous.settings.RendezvousSettings` and the backend's
spec (:mod:`elastic.rendezvous.backend_spec`), parsed once from the flags. It never imports torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping

from elastic.rendezvous.backend_spec import BackendSpec, StandaloneSpec, StaticSpec
from elastic.rendezvous.settings import RendezvousSettings


class Std(enum.IntFlag):
    """Which standard streams of a worker go to log files (``--redirects``) or are also shown (``--tee``)."""

    NONE = 0
    OUT = 1
    ERR = 2
    ALL = 3


@dataclass(frozen=True)
class StdMask:
    """A stream mask for all local ranks (``default``) with per-rank overrides (``0:1,1:2``)."""

    default: Std = Std.NONE
    per_rank: Mapping[int, Std] = field(default_factory=dict)

    def for_rank(self, local_rank: int) -> Std:
        return self.per_rank.get(local_rank, self.default)


@dataclass(frozen=True)
class Entrypoint:
    """What each worker runs.

    ``kind`` is ``script`` (``python -u script.py``), ``module`` (``python -u -m pkg``),
    ``command`` (``--no-python``: the executable itself) or ``run_path`` (``--run-path``:
    ``runpy.run_path`` in a fresh interpreter).
    """

    kind: str
    target: str
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class LaunchConfig:
    """Everything the agent needs, validated; field names follow torchrun's flags.

    Attributes:
        min_nodes, max_nodes: from ``--nnodes N`` or ``MIN:MAX``.
        nproc_per_node: worker processes on this node (``auto``/``gpu``/``cpu`` resolved).
        nproc_source: how nproc was decided (``"2"``, ``"auto: 4 GPUs"``, ``"cpu: 8 cores"``).
        run_id: ``--rdzv-id`` (random for ``--standalone``).
        backend: ``--rdzv-backend``, ``--rdzv-endpoint`` and the connection keys of
            ``--rdzv-conf``, parsed (a :class:`StandaloneSpec` for ``--standalone``, which the
            runner turns into a hosted store; a :class:`StaticSpec`, with ``--node-rank`` and
            the master, for the static backend).
        rendezvous: the engine's settings from the other ``--rdzv-conf`` keys; when not given,
            the defaults for ``run_id``, ``min_nodes`` and ``max_nodes`` (which it must match).
        max_restarts: restarts allowed after worker failures (membership changes are free).
        monitor_interval: seconds between worker-state checks.
        start_method: ``spawn``/``fork``/``forkserver`` (accepted for compatibility; workers are
            always fresh processes).
        role: worker role name.
        entrypoint: what workers run.
        log_dir: base of ``<log_dir>/<run_id>/<node_id>/attempt_<k>/<local_rank>/{stdout,stderr}.log``.
        redirects, tee: stream masks.
        local_ranks_filter: local ranks whose output is shown on the console (None: all).
        log_line_prefix_template: torchrun's ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``: the console
            prefix of tee'd lines, with ``${role_name}``, ``${rank}`` and ``${local_rank}``
            substituted (None or empty: ``[${role_name}${local_rank}]:``).
        logs_specs: ``--logs-specs``: the name of a ``torchrun.logs_specs`` entry point (a torch
            ``LogsSpecs`` class) that decides where each rank's output goes; None: our layout.
        local_addr: address other nodes use to reach this one (None: the host's FQDN).
        signals_to_handle: signal names forwarded to workers.
        shutdown_timeout: seconds between SIGTERM and SIGKILL when stopping workers.
        exit_barrier_timeout: seconds to wait for the other nodes' workers to finish.
        metrics_port: serve /healthz and /metrics there (None: off).
        metrics_addr: the address the metrics port listens on (loopback unless asked).
        event_log: path of the JSON-lines event log (None: off).
        dry_run: print the resolved config and exit.
        verbose: ``-v``: every INFO line on the console, not only the meaningful changes.
        prewarm: fork workers from pre-warmed templates (:mod:`elastic.agent.prewarm.pool`);
            resolved by :mod:`elastic.launch.prewarm_flags` (on with live recovery unless
            ``--no-prewarm``; never for ``--no-python`` workers).
        prewarm_modules: what the templates import (``--prewarm-modules``).
        live_recovery: keep healthy workers across rounds, publishing each round to them
            (:mod:`elastic.agent.live`); ``--live-recovery``.
        live_recovery_timeout: seconds a live worker has to form a published round before the
            node's group is restarted as without live recovery.
    """

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    entrypoint: Entrypoint
    nproc_source: str = ""
    run_id: str = "none"
    backend: BackendSpec = field(default_factory=StaticSpec)
    rendezvous: RendezvousSettings = None  # type: ignore[assignment]  # filled in by __post_init__
    max_restarts: int = 0
    monitor_interval: float = 0.1
    start_method: str = "spawn"
    role: str = "default"
    log_dir: str | None = None
    redirects: StdMask = field(default_factory=StdMask)
    tee: StdMask = field(default_factory=StdMask)
    local_ranks_filter: frozenset[int] | None = None
    log_line_prefix_template: str | None = None
    logs_specs: str | None = None
    local_addr: str | None = None
    signals_to_handle: tuple[str, ...] = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
    shutdown_timeout: float = 30.0
    exit_barrier_timeout: float = 300.0
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    event_log: str | None = None
    dry_run: bool = False
    verbose: bool = False
    prewarm: bool = False
    prewarm_modules: tuple[str, ...] = ("torch",)
    live_recovery: bool = False
    live_recovery_timeout: float = 60.0

    def __post_init__(self) -> None:
        """Default the rendezvous settings, or check that they describe this run.

        Raises:
            RendezvousConfigError: the run id or node range is invalid (no settings given).
            ValueError: the given settings name another run id or node range.
        """
        if self.rendezvous is None:
            object.__setattr__(self, "rendezvous", RendezvousSettings(self.run_id, self.min_nodes, self.max_nodes))
        given = (self.rendezvous.run_id, self.rendezvous.min_nodes, self.rendezvous.max_nodes)
        if given != (self.run_id, self.min_nodes, self.max_nodes):
            raise ValueError(f"The rendezvous settings are for run {given[0]!r} with {given[1]}:{given[2]} nodes, "
                             f"not run {self.run_id!r} with {self.min_nodes}:{self.max_nodes}.")

    @property
    def standalone(self) -> bool:
        """Whether the runner hosts an embedded built-in store on a free port (``--standalone``)."""
        return isinstance(self.backend, StandaloneSpec)
