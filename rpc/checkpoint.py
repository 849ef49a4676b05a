"""Checkpoints of the parameters each worker owns, keyed by role and role rank, across restarts.

    modules = {"model": remote_module}                 # or a Pipeline's .modules()
    step = rpc.checkpoint.restore(ckpt_dir, modules)   # 0 on a fresh start
    for step in range(step, steps):
        rpc.train_step(...)
        rpc.checkpoint.save(ckpt_dir, step + 1, modules)

:func:`save` asks each owner (over RPC) to write its own modules' state to
``<dir>/<role><role_rank>/step-<N>.pt``: the parameters never travel, and a restarted attempt
finds them under the same names, since role and role rank survive a restart of the same
layout. Each file is written atomically (a new temporary file created exclusively beside it,
fsync, ``os.replace``: :func:`elastic.agent.private_files.replace_file`), and each
worker keeps its last ``keep`` (default 2) steps: a job killed between two owners' writes of
step N still has step N-1 everywhere. :func:`restore` picks the newest step every owner has
and loads it on the owners.

:class:`ShardStore` is the file layer, usable on its own (and by tests) without RPC.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from elastic.agent.private_files import replace_file
from rpc.env import RpcWorkerEnv, worker_name
from rpc.errors import CheckpointError

if TYPE_CHECKING:
    import torch
    from torch.distributed.rpc import RRef

__all__ = ["ShardStore", "latest_common_step", "restore", "restore_local", "save", "save_local"]

FORMAT_VERSION = 1
_STEP_FILE = re.compile(r"step-([0-9]+)\.pt")


@dataclass(frozen=True)
class ShardStore:
    """The checkpoint files of one worker: ``<directory>/<role><role_rank>/step-<N>.pt``.

    Raises (on construction): CheckpointError if ``keep`` < 1; WorkerEnvError for a bad role.
    """

    directory: Path
    role: str
    role_rank: int
    keep: int = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "directory", Path(self.directory))
        if self.keep < 1:
            raise CheckpointError(f"The number of checkpoints to keep ({self.keep}) must be at least 1.")
        worker_name(self.role, self.role_rank)

    @classmethod
    def for_this_worker(cls, directory: str | os.PathLike, keep: int = 2,
                        environ: Mapping[str, str] | None = None) -> ShardStore:
        """The store of the worker described by ``environ`` (default ``os.environ``)."""
        env = RpcWorkerEnv.from_environ(os.environ if environ is None else environ)
        return cls(Path(directory), env.role, env.role_rank, keep)

    @property
    def folder(self) -> Path:
        return self.directory / worker_name(self.role, self.role_rank)

    def path(self, step: int) -> Path:
        return self.folder / f"step-{step:09d}.pt"

    def steps(self) -> list[int]:
        """The steps saved here, oldest first (temporary files of interrupted writes are ignored)."""
        if not self.folder.is_dir():
            return []
        return sorted(int(match[1]) for name in os.listdir(self.folder) if (match := _STEP_FILE.fullmatch(name)))

    def save(self, step: int, state: Mapping[str, Any]) -> Path:
        """Write ``state`` for ``step`` atomically, then drop all but the newest ``keep`` steps.

        Raises:
            CheckpointError: ``step`` is not positive, or the file could not be written.
        """
        import torch

        if step < 1:
            raise CheckpointError(f"The step of a checkpoint ({step}) must be positive (0 means none).")
        target = self.path(step)
        record = {"v": FORMAT_VERSION, "role": self.role, "role_rank": self.role_rank, "step": step,
                  "state": dict(state)}
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            replace_file(target, lambda out: torch.save(record, out), mode=0o666, durable=True)
        except OSError as error:
            raise CheckpointError(f"Could not write the checkpoint {target}: {error}") from error
        for old in self.steps()[:-self.keep]:
            self.path(old).unlink(missing_ok=True)
        return target

    def load(self, step: int) -> dict[str, Any]:
        """The state saved for ``step``.

        Raises:
            CheckpointError: no such file, or it is unreadable, of another version, or another worker's.
        """
        import torch

        path = self.path(step)
        try:
            record = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise CheckpointError(f"{worker_name(self.role, self.role_rank)} has no checkpoint of step {step} "
                                  f"(have {self.steps()}) in {self.folder}.") from None
        except Exception as error:
            raise CheckpointError(f"The checkpoint {path} is unreadable: {error}") from error
        expected = (FORMAT_VERSION, self.role, self.role_rank, step)
        found = None
        if isinstance(record, dict):
            found = tuple(record.get(key) for key in ("v", "role", "role_rank", "step"))
        if found != expected:
            raise CheckpointError(
                f"The checkpoint {path} holds {found} (version, role, role rank, step); expected {expected}."
            )
        return record["state"]


def latest_common_step(steps_by_worker: Mapping[str, Sequence[int]]) -> int:
    """The newest step every worker has saved; 0 if there is none (or no worker)."""
    if not steps_by_worker:
        return 0
    common = set.intersection(*(set(steps) for steps in steps_by_worker.values()))
    return max(common, default=0)


# -- on the worker that owns the modules --------------------------------------------------------


def save_local(directory: str | os.PathLike, step: int, modules: Mapping[str, torch.nn.Module], keep: int = 2) -> Path:
    """Save the state dicts of ``modules`` (owned by this worker) for ``step``. Raises CheckpointError."""
    state = {name: module.state_dict() for name, module in modules.items()}
    return ShardStore.for_this_worker(directory, keep).save(step, {"modules": state})


def restore_local(directory: str | os.PathLike, modules: Mapping[str, torch.nn.Module], step: int | None = None) -> int:
    """Load ``step`` (default: this worker's newest) into ``modules``; returns it, or 0 if none saved.

    Raises:
        CheckpointError: the step is missing, or a module's state is missing or does not fit.
    """
    store = ShardStore.for_this_worker(directory)
    if step is None:
        steps = store.steps()
        if not steps:
            return 0
        step = steps[-1]
    saved = store.load(step).get("modules", {})
    for name, module in modules.items():
        if name not in saved:
            raise CheckpointError(f"The checkpoint {store.path(step)} has no module {name!r} (has {sorted(saved)}).")
        try:
            module.load_state_dict(saved[name])
        except RuntimeError as error:
            raise CheckpointError(
                f"The checkpoint {store.path(step)}: module {name!r} does not fit: {error}"
            ) from error
    return step


# -- from any worker, over RPC ------------------------------------------------------------------


def save(directory: str | os.PathLike, step: int, modules: Mapping[str, Any], keep: int = 2) -> None:
    """Have each owner save its ``modules`` for ``step``; returns when all have.

    ``modules`` maps names to :class:`~rpc.remote.RemoteModule`, RRefs to modules, or local
    modules. Raises CheckpointError (from an owner) when a write fails.
    """
    import torch.distributed.rpc as trpc

    futures = [trpc.rpc_async(owner, _save_on_owner, (str(directory), step, rrefs, keep))
               for owner, rrefs in _by_owner(modules).items()]
    for future in futures:
        future.wait()


def restore(directory: str | os.PathLike, modules: Mapping[str, Any]) -> int:
    """Load the newest step every owner has into ``modules``; returns it, or 0 (nothing loaded).

    Raises CheckpointError (from an owner) when a saved state is missing or does not fit.
    """
    import torch.distributed.rpc as trpc

    owners = _by_owner(modules)
    steps = {owner: trpc.rpc_sync(owner, _steps_on_owner, (str(directory),)) for owner in owners}
    step = latest_common_step(steps)
    if step == 0:
        return 0
    futures = [trpc.rpc_async(owner, _restore_on_owner, (str(directory), step, rrefs))
               for owner, rrefs in owners.items()]
    for future in futures:
        future.wait()
    return step


def _by_owner(modules: Mapping[str, Any]) -> dict[str, dict[str, RRef]]:
    import torch
    from torch.distributed.rpc import PyRRef, RRef

    from rpc.remote import RemoteModule

    owners: dict[str, dict[str, RRef]] = {}
    for name, module in modules.items():
        if isinstance(module, RemoteModule):
            rref = module.module_rref
        elif isinstance(module, PyRRef):
            rref = module
        elif isinstance(module, torch.nn.Module):
            rref = RRef(module)
        else:
            raise TypeError(
                f"Module {name!r} is a {type(module).__name__}; expected a RemoteModule, an RRef or an nn.Module."
            )
        owners.setdefault(rref.owner_name(), {})[name] = rref
    return owners


def _save_on_owner(directory: str, step: int, rrefs: dict[str, RRef], keep: int) -> str:
    return str(save_local(directory, step, {name: rref.local_value() for name, rref in rrefs.items()}, keep))


def _steps_on_owner(directory: str) -> list[int]:
    return ShardStore.for_this_worker(directory).steps()


def _restore_on_owner(directory: str, step: int, rrefs: dict[str, RRef]) -> int:
    return restore_local(directory, {name: rref.local_value() for name, rref in rrefs.items()}, step)
