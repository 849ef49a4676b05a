"""The launcher's resolved configuration: what ``elasticrun`` was asked to do.

:class:`LaunchConfig` is produced by the pure ``config_from_args(argv, environ)`` in
:mod:`elastic.launch.cli` and consumed by the agent. It never imports torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping


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
        rdzv_backend: ``etcd``/``etcd-v3``/``tcp``/``c10d``/``static``.
        rdzv_endpoint: backend endpoint(s); for ``--standalone``, filled in by the agent.
        run_id: ``--rdzv-id`` (random for ``--standalone``).
        rdzv_conf: ``--rdzv-conf`` key/values (merged when repeated).
        standalone: host an embedded built-in store on a free port.
        max_restarts: restarts allowed after worker failures (membership changes are free).
        monitor_interval: seconds between worker-state checks.
        start_method: ``spawn``/``fork``/``forkserver`` (accepted for compatibility; workers are
            always fresh processes).
        role: worker role name.
        entrypoint: what workers run.
        log_dir: base of ``<log_dir>/<run_id>/attempt_<k>/<local_rank>/{stdout,stderr}.log``.
        redirects, tee: stream masks.
        local_ranks_filter: local ranks whose output is shown on the console (None: all).
        node_rank: for the static backend.
        master_addr, master_port: fixed master (static backend); None: chosen per round.
        local_addr: address other nodes use to reach this one (None: the host's FQDN).
        signals_to_handle: signal names forwarded to workers.
        shutdown_timeout: seconds between SIGTERM and SIGKILL when stopping workers.
        exit_barrier_timeout: seconds to wait for the other nodes' workers to finish.
        metrics_port: serve /healthz and /metrics there (None: off).
        metrics_addr: the address the metrics port listens on (loopback unless asked).
        event_log: path of the JSON-lines event log (None: off).
        dry_run: print the resolved config and exit.
        prewarm: fork workers from pre-warmed templates (:mod:`elastic.agent.prewarm.pool`).
        prewarm_modules: what the templates import (``--prewarm-modules``).
    """

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    entrypoint: Entrypoint
    nproc_source: str = ""
    rdzv_backend: str = "static"
    rdzv_endpoint: str = ""
    run_id: str = "none"
    rdzv_conf: Mapping[str, str] = field(default_factory=dict)
    standalone: bool = False
    max_restarts: int = 0
    monitor_interval: float = 0.1
    start_method: str = "spawn"
    role: str = "default"
    log_dir: str | None = None
    redirects: StdMask = field(default_factory=StdMask)
    tee: StdMask = field(default_factory=StdMask)
    local_ranks_filter: frozenset[int] | None = None
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    local_addr: str | None = None
    signals_to_handle: tuple[str, ...] = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
    shutdown_timeout: float = 30.0
    exit_barrier_timeout: float = 300.0
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    event_log: str | None = None
    dry_run: bool = False
    prewarm: bool = False
    prewarm_modules: tuple[str, ...] = ("torch",)
