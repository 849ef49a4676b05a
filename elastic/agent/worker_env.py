"""What each worker process is given: its environment and its command line, as torchrun gives them.

Pure functions of their inputs (no ``os.environ`` reads, no I/O), so the agent can build and
log them, and tests can compare them with real torchrun workers key by key.

Matches ``torchrun`` 2.13 (``LocalElasticAgent._start_workers`` + ``DefaultLogsSpecs.reify`` +
``run.config_from_args``): a worker sees the agent's environment plus

===============================  =============================================================
``RANK``                         ``base_rank + local_rank``: the local world sizes of the members
                                 before this node in group-rank order, summed (torchrun's
                                 ``_assign_worker_ranks``), from the round record
``LOCAL_RANK``                   the worker's index on this node
``WORLD_SIZE``                   the sum of every member's local world size
``LOCAL_WORLD_SIZE``             ``nproc``
``GROUP_RANK``                   this node's rank in the round
``GROUP_WORLD_SIZE``             nodes in the round
``ROLE_NAME``                    ``--role`` (default ``default``)
``ROLE_RANK``/``ROLE_WORLD_SIZE``  the same sums among the members of this role
``MASTER_ADDR``/``MASTER_PORT``  the round's master (a fresh port per round, DESIGN §4.6)
``TORCHELASTIC_RESTART_COUNT``   restarts after failures so far, agreed in the round record
``TORCHELASTIC_MAX_RESTARTS``    ``--max-restarts``
``TORCHELASTIC_RUN_ID``          ``--rdzv-id``
``TORCHELASTIC_USE_AGENT_STORE`` ``True``/``False`` (Python's ``str(bool)``, as torchrun)
``TORCHELASTIC_ERROR_FILE``      where ``@record`` writes the worker's error JSON
``TORCHELASTIC_SIGNALS_TO_HANDLE``  ``--signals-to-handle`` (torchrun exports it to its own
                                 environment, so workers inherit it)
``TORCH_NCCL_ASYNC_ERROR_HANDLING``  inherited value, else ``1``
``OMP_NUM_THREADS``              inherited value, else ``1`` when ``nproc > 1``
===============================  =============================================================

Unlike torchrun, an inline ``token=``/``password=`` in ``PET_RDZV_CONF`` is removed (the rest
of the variable is kept): a rendezvous secret never reaches a worker.
torchrun 2.13 does **not** set ``NCCL_ASYNC_ERROR_HANDLING`` or ``TORCH_NCCL_DUMP_ON_TIMEOUT``.
Deliberate differences: no ``TORCHELASTIC_TIMER_FILE`` (we run no ``FileTimerServer`` for
``TORCHELASTIC_ENABLE_FILE_TIMER=1``) and no ``--virtual-local-rank`` ``CUDA_VISIBLE_DEVICES``
remapping; ``CUDA_VISIBLE_DEVICES`` is inherited unchanged, as torchrun does by default.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from string import Template
from typing import TYPE_CHECKING, Mapping

from elastic.agent.run_path import RUN_PATH_BOOTSTRAP
from elastic.config import Entrypoint, LaunchConfig
from elastic.rendezvous.secret_sources import without_inline_secrets

if TYPE_CHECKING:  # the handler module pulls in the backends; workers need none of it
    from elastic.rendezvous.api import RendezvousInfo

__all__ = [
    "OMP_NOTICE",
    "WorkerRanks",
    "worker_ranks",
    "RUN_PATH_BOOTSTRAP",
    "omp_threads_notice",
    "fixed_worker_env",
    "python_executable",
    "worker_argv",
    "worker_env",
]

# Said once by the agent when it sets OMP_NUM_THREADS (torchrun prints a four-line banner of its
# own for the same reason; one line here, like the agent's others).
OMP_NOTICE = ("OMP_NUM_THREADS is not set: each of this node's {nproc} workers gets OMP_NUM_THREADS=1 "
              "(torchrun's default, so they do not overload the machine); set it yourself to tune")


@dataclass(frozen=True)
class WorkerRanks:
    """Where one worker sits: its global and role ranks and the sizes they are out of."""

    rank: int
    world_size: int
    role_rank: int
    role_world_size: int


def worker_ranks(config: LaunchConfig, rdzv: RendezvousInfo, local_rank: int) -> WorkerRanks:
    """The ranks of worker ``local_rank``: from the round record's layout of this node when the
    handler gives one, else (static rendezvous: no exchange) as if every node ran ``nproc``.

    Raises:
        ValueError: the layout's local world size is not ``nproc_per_node``, or the group rank
            is outside the round.
    """
    layout = rdzv.layout
    nproc = config.nproc_per_node
    if layout is None:
        if not 0 <= rdzv.group_rank < rdzv.group_world_size:
            raise ValueError(
                f"The group rank ({rdzv.group_rank}) must be in [0, {rdzv.group_world_size})."
            )
        rank, world = rdzv.group_rank * nproc + local_rank, rdzv.group_world_size * nproc
        return WorkerRanks(rank, world, rank, world)
    if layout.local_world_size != nproc:
        raise ValueError(
            f"The round record gives this node {layout.local_world_size} workers, but it runs {nproc}."
        )
    return WorkerRanks(layout.base_rank + local_rank, layout.world_size,
                       layout.role_base_rank + local_rank, layout.role_world_size)


def worker_env(
    base: Mapping[str, str],
    config: LaunchConfig,
    rdzv: RendezvousInfo,
    local_rank: int,
    *,
    restart_count: int,
    error_file: str,
    use_agent_store: bool,
) -> dict[str, str]:
    """The full environment of worker ``local_rank``: ``base`` plus torchrun's keys.

    ``base`` is the agent's environment; it is copied, never changed.

    Raises:
        ValueError: ``local_rank`` is outside ``[0, nproc_per_node)``, ``restart_count`` is
            negative, or the rendezvous result is inconsistent.
    """
    nproc = config.nproc_per_node
    if not 0 <= local_rank < nproc:
        raise ValueError(f"The local rank ({local_rank}) must be in [0, {nproc}).")
    if restart_count < 0:
        raise ValueError(f"The restart count ({restart_count}) must not be negative.")
    ranks = worker_ranks(config, rdzv, local_rank)

    env = fixed_worker_env(base, config, local_rank)
    env.update(
        {
            "RANK": str(ranks.rank),
            "WORLD_SIZE": str(ranks.world_size),
            "GROUP_RANK": str(rdzv.group_rank),
            "GROUP_WORLD_SIZE": str(rdzv.group_world_size),
            "ROLE_RANK": str(ranks.role_rank),
            "ROLE_WORLD_SIZE": str(ranks.role_world_size),
            "MASTER_ADDR": rdzv.master_addr,
            "MASTER_PORT": str(rdzv.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(restart_count),
            "TORCHELASTIC_RUN_ID": rdzv.run_id,
            "TORCHELASTIC_USE_AGENT_STORE": str(bool(use_agent_store)),
            "TORCHELASTIC_ERROR_FILE": error_file,
        }
    )
    return env


def fixed_worker_env(base: Mapping[str, str], config: LaunchConfig, local_rank: int) -> dict[str, str]:
    """The part of :func:`worker_env` that no round or attempt changes: ``base`` plus
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``ROLE_NAME``, ``TORCHELASTIC_MAX_RESTARTS``,
    ``TORCHELASTIC_SIGNALS_TO_HANDLE``, ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` and
    ``OMP_NUM_THREADS``. A pre-warmed template imports its modules with it
    (:mod:`elastic.agent.prewarm.pool`), so what they read at import is what a worker would see.
    Inline rendezvous secrets in ``base`` (``PET_RDZV_CONF`` with ``token=``/``password=``) are
    left out: the agent has read them, and no worker may inherit them."""
    env = without_inline_secrets(base)
    env.update(
        {
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(config.nproc_per_node),
            "ROLE_NAME": config.role,
            "TORCHELASTIC_MAX_RESTARTS": str(config.max_restarts),
            "TORCHELASTIC_SIGNALS_TO_HANDLE": ",".join(config.signals_to_handle),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": base.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        }
    )
    if "OMP_NUM_THREADS" not in base and config.nproc_per_node > 1:
        env["OMP_NUM_THREADS"] = "1"
    return env


def omp_threads_notice(base: Mapping[str, str], nproc_per_node: int) -> str | None:
    """The one line saying that :func:`worker_env` sets OMP_NUM_THREADS=1, else ``None``."""
    if "OMP_NUM_THREADS" not in base and nproc_per_node > 1:
        return OMP_NOTICE.format(nproc=nproc_per_node)
    return None


def python_executable(base: Mapping[str, str]) -> str:
    """The interpreter workers run under: ``$PYTHON_EXEC`` if set (as torchrun), else ours."""
    return base.get("PYTHON_EXEC") or sys.executable


def worker_argv(
    entrypoint: Entrypoint, python: str = sys.executable, local_rank: int | None = None
) -> list[str]:
    """The command line of one worker.

    ``script``: ``[python, -u, script, *args]``; ``module``: ``[python, -u, -m, mod, *args]``;
    ``command`` (``--no-python``): ``[cmd, *args]``; ``run_path``: ``[python, -u, -c,
    RUN_PATH_BOOTSTRAP, script, *args]`` (:mod:`.run_path`). With ``local_rank``,
    ``${local_rank}`` in the args is replaced by it, as torchrun's macro substitution does.

    Raises:
        ValueError: unknown entrypoint kind or empty target.
    """
    if not entrypoint.target:
        raise ValueError("The entrypoint target must not be empty.")
    args = list(entrypoint.args)
    if local_rank is not None:
        args = [Template(a).safe_substitute(local_rank=str(local_rank)) for a in args]
    kind = entrypoint.kind
    if kind == "script":
        return [python, "-u", entrypoint.target, *args]
    if kind == "module":
        return [python, "-u", "-m", entrypoint.target, *args]
    if kind == "command":
        return [entrypoint.target, *args]
    if kind == "run_path":
        return [python, "-u", "-c", RUN_PATH_BOOTSTRAP, entrypoint.target, *args]
    raise ValueError(
        f"The entrypoint kind ({kind!r}) must be one of script, module, command, run_path."
    )
