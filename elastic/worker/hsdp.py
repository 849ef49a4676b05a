"""HSDP under live recovery: FSDP2 shards a replica inside a node, replicas span the nodes.

A node's local ranks hold one replica of the model, sharded by FSDP2 (``fully_shard``) over
the *shard group*: a gloo group of those ranks, formed once by :func:`form_shard_group` and
fixed for the life of the replica. The replicate dimension is the live group: with
``LiveOptions(hsdp=True)`` it forms with whole replicas only
(:func:`elastic.worker.decisions.decide_close`) and heals each shard index from a rank holding
it (:func:`elastic.worker.decisions.plan_shard_heals`). So:

* :func:`average_gradients`, after backward, averages each rank's gradient shard over the
  replicas (one all-reduce on the live group, each shard index in its own slot), then the
  replica agrees on the outcome over its shard group: a step commits on every rank of a
  replica or on none, so a replica's ranks never stand at different steps;
* :class:`ShardState` and :class:`OptimizerShardState` make a heal send a rank's own shard
  only (the DTensors' local tensors: parameters and optimizer state).

A replica whose worker dies is broken (its partners cannot all-gather): each partner's
watchdog sees the death within :data:`WATCH_INTERVAL` and exits the process (code
:data:`BROKEN_REPLICA_EXIT`), so the agent replaces the whole replica; its new workers form the
node's next shard group and heal shard by shard while the other replicas train on. A node's
workers find each other through a file store in the system's temporary directory named after
the run, the host and the node's log directory (:func:`_node_store_path`).
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Mapping

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from elastic.worker.errors import GroupLost, LiveRecoveryError, WorkerEnvError

if TYPE_CHECKING:
    from elastic.worker.live import LiveTraining

__all__ = ["BROKEN_REPLICA_EXIT", "OptimizerShardState", "PartnerWatch", "ShardGroup", "ShardState",
           "average_gradients", "form_shard_group", "register", "shard_checksum"]


WATCH_INTERVAL = 0.05
"""Seconds between two looks of the watchdog at the shard partners' processes."""
BROKEN_REPLICA_EXIT = 75
"""The exit code of a worker whose shard partner died (the agent replaces it, as a crash)."""


@dataclass(frozen=True)
class ShardGroup:
    """A replica's shard group: its gloo group, the 1-D mesh ``fully_shard`` takes, this rank's
    shard index among ``size``, which of the node's shard groups it is (``generation``), and
    the watchdog of the partners' processes. :meth:`close` (or leaving a ``with`` block) says
    this rank is done, so its partners do not take its exit for a crash."""

    group: dist.ProcessGroup
    mesh: DeviceMesh
    index: int
    size: int
    generation: int
    watch: PartnerWatch

    def close(self) -> None:
        self.watch.close()
        # DTensor's caches keep the mesh for the process's life; without the group in it, the
        # group (its gloo threads) ends with the model instead of at the interpreter's exit
        registry = getattr(self.mesh, "_pg_registry", None)  # private to torch: absent, nothing to drop
        if isinstance(registry, dict):
            registry.pop(self.group.group_name, None)

    def register(self, live: LiveTraining | None = None) -> None:
        """Make the group known to torch again after a re-forming forgot it, and let the
        watchdog abandon ``live``'s collectives when a partner's failed: pass it as
        ``LiveTraining(on_reform=shards.register)``."""
        register(self.group)
        if live is not None:
            self.watch.follow(live)
            live.control.boundary_hook = lambda: agree_at_boundary(live, self)

    def __enter__(self) -> ShardGroup:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        if exc_type is None:  # left by an error: the partners take this exit for a crash
            self.close()


class PartnerWatch:
    """Exits this process when a shard partner's process is gone without saying it was done."""

    def __init__(self, store: Any, index: int, pids: dict[int, int], interval: float = WATCH_INTERVAL) -> None:
        self._store, self._index, self._pids, self._interval = store, index, pids, interval
        self._live: LiveTraining | None = None
        self._seen_lost = b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="elastic-hsdp-partners", daemon=True)
        self._thread.start()

    def follow(self, live: LiveTraining) -> None:
        """Abandon ``live``'s collectives in flight when a partner says their group failed."""
        self._live = live

    def tell_lost(self, identity: tuple[int, int] | None) -> None:
        """Say that the group ``identity`` (round, generation) failed here: a partner hung in
        one of its collectives (gloo's ring waits on a live peer that left it) gives it up."""
        if identity is None:
            return
        try:
            self._store.set("lost", f"{identity[0]}/{identity[1]}/{self._index}")
        except (RuntimeError, dist.DistStoreError):
            pass  # the partner then waits for the interrupt grace

    def _check_lost(self) -> None:
        live = self._live
        if live is None:
            return
        try:
            if not self._store.check(["lost"]):
                return
            raw = self._store.get("lost")
        except (RuntimeError, dist.DistStoreError):
            return
        if raw == self._seen_lost:
            return
        self._seen_lost = raw
        round_, generation, index = (int(part) for part in raw.decode().split("/"))
        if index != self._index:
            live.control.abandon((round_, generation), f"shard partner {index} saw the group fail")

    def close(self) -> None:
        self._stop.set()
        try:
            self._store.set(f"done-{self._index}", "1")
        except (RuntimeError, dist.DistStoreError):
            pass  # the partners then see a crash: they are replaced with this replica

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._check_lost()
            for index, pid in self._pids.items():
                if _alive(pid) or self._stop.is_set():
                    continue
                try:
                    if self._store.check([f"done-{index}"]):
                        continue
                except (RuntimeError, dist.DistStoreError):
                    pass
                print(f"pid {os.getpid()}: shard partner {index} (pid {pid}) died: this replica is broken; "
                      f"exiting {BROKEN_REPLICA_EXIT} to be replaced and healed", file=sys.stderr, flush=True)
                os._exit(BROKEN_REPLICA_EXIT)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _node_store_path(environ: Mapping[str, str]) -> str:
    """Where this node's workers meet: named after the run, the host and the agent's log
    directory for the node (``<root>/<run>/<node>/attempt_<k>/<local rank>/error.json``), or
    the parent process (the agent) without one."""
    run_id = environ.get("TORCHELASTIC_RUN_ID") or "none"
    rank_dir = os.path.dirname(environ.get("TORCHELASTIC_ERROR_FILE", ""))
    attempt_dir = os.path.dirname(rank_dir)
    node = os.path.dirname(attempt_dir) if os.path.basename(attempt_dir).startswith("attempt_") else f"pid {os.getppid()}"
    key = hashlib.sha256(f"{run_id}/{socket.gethostname()}/{node}".encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"elastic-hsdp-{key}")


def form_shard_group(environ: Mapping[str, str] | None = None, timeout: float = 60.0) -> ShardGroup:
    """Form this node's shard group of ``LOCAL_WORLD_SIZE`` ranks, this rank at ``LOCAL_RANK``.

    The node's workers count their arrivals in a file store; each ``LOCAL_WORLD_SIZE``
    arrivals form one generation, so a replica's replacements form a new group, not the
    broken one. Call it before :class:`~elastic.worker.live.LiveTraining` starts.

    Raises:
        WorkerEnvError: ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` are missing or bad.
        LiveRecoveryError: the partners did not arrive within ``timeout`` seconds, or this
            torch's private API for building a group changed.
    """
    environ = os.environ if environ is None else environ
    try:
        index, size = int(environ["LOCAL_RANK"]), int(environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError) as error:
        raise WorkerEnvError(f"HSDP needs LOCAL_RANK and LOCAL_WORLD_SIZE in the environment ({error}).") from None
    if not 0 <= index < size:
        raise WorkerEnvError(f"LOCAL_RANK ({index}) must be in [0, LOCAL_WORLD_SIZE={size}).")
    try:
        store = dist.FileStore(_node_store_path(environ), -1)
        store.set_timeout(timedelta(seconds=timeout))
        generation = (store.add("arrivals", 1) - 1) // size
        name = f"elastic-hsdp-shard-{generation}"
        generation_store = dist.PrefixStore(f"generation-{generation}", store)
        generation_store.set(f"pid-{index}", str(os.getpid()))
        group = _gloo_group(dist.PrefixStore("group", generation_store), index, size, name, timeout)
        pids = {peer: int(generation_store.get(f"pid-{peer}")) for peer in range(size) if peer != index}
    except (RuntimeError, ValueError, dist.DistStoreError) as error:
        raise LiveRecoveryError(f"local rank {index}: the shard group of {size} did not form: {error}") from error
    register(group)
    mesh = DeviceMesh("cpu", torch.arange(size), _init_backend=False, _rank=index)
    mesh._dim_group_names = [name]
    mesh._pg_registry[name] = group
    return ShardGroup(group, mesh, index, size, generation, PartnerWatch(generation_store, index, pids))


def _gloo_group(store: Any, rank: int, size: int, name: str, timeout: float) -> dist.ProcessGroup:
    """A gloo group outside the default group's world (``destroy_process_group()`` at each
    re-forming would shut it down), named ``name``."""
    try:
        group = dist.ProcessGroup(store, rank, size)
        backend = dist.ProcessGroupGloo(store, rank, size, timedelta(seconds=timeout))
        group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
        group._set_group_name(name)
    except (AttributeError, TypeError) as error:
        raise LiveRecoveryError(f"cannot build a shard group with torch {torch.__version__}: {error}") from error
    return group


def register(group: dist.ProcessGroup) -> None:
    """Make ``group`` known to torch by its ranks and name (DTensor's collectives find groups by
    name); every re-forming's ``destroy_process_group()`` forgets it, so call it after each."""
    world = dist.distributed_c10d._world
    if group in world.pg_group_ranks:
        return
    world.pg_group_ranks[group] = {rank: rank for rank in range(group.size())}
    try:
        dist.distributed_c10d._register_process_group(group.group_name, group)
    except RuntimeError:
        pass  # still registered by name: only the ranks were forgotten


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def average_gradients(live: LiveTraining, module: torch.nn.Module, shards: ShardGroup) -> None:
    """Average this rank's gradient shards over the replicas, then agree with the replica.

    One all-reduce on the live group of a buffer with a slot per shard index (sized from the
    parameters' global shapes, the same on every rank): each rank fills its own slot and reads
    it back divided by the number of replicas. Then one all-reduce over the shard group says
    whether every rank of the replica got its average; if one did not, none commits the step.

    Raises:
        GroupLost: the all-reduce failed here or on a shard partner, or a newer round abandoned
            it: the step runs again after the group is re-formed.
        RuntimeError: the shard group failed (a partner died: the replica is broken).
    """
    shards.register()
    params = list(module.parameters())
    slot = sum(_slot_numel(p, shards.size) for p in params)
    flat = torch.zeros(slot * shards.size)
    offset = shards.index * slot
    grads = []
    for param in params:
        grad = None if param.grad is None else _local(param.grad)
        if grad is not None:
            flat[offset:offset + grad.numel()].copy_(grad.reshape(-1))
            grads.append((grad, offset))
        offset += _slot_numel(param, shards.size)
    lost: GroupLost | None = None
    try:
        live.all_reduce(flat)
    except GroupLost as error:
        lost = error
        shards.watch.tell_lost(live.control.identity)
    agreed = torch.tensor([0 if lost else 1], dtype=torch.int64)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=shards.group)
    if lost is not None:
        raise lost
    if not agreed.item():
        raise GroupLost(f"step {live.step}: a shard partner's all-reduce failed; the replica runs the step again",
                        live.round.round)
    flat.div_(max(1, live.world_size // shards.size))
    for grad, start in grads:
        grad.copy_(flat[start:start + grad.numel()].view_as(grad))


REFORM_WAIT = 2.0
"""The longest a rank waits to see the round or generation a shard partner will re-form at this
step boundary (both learn of it from their agent's pipe or the store, milliseconds apart)."""


def agree_at_boundary(live: LiveTraining, shards: ShardGroup, clock: Any = time.monotonic) -> None:
    """At a step boundary, before the group is re-formed there: if a partner will re-form
    (a newer round or generation) and this rank does not see it yet, wait until it does, so
    the replica goes to the formation whole. A partner going alone would leave this rank in
    FSDP's next all-gather, and the formation (whole replicas only) waiting for it.

    Raises:
        RuntimeError: the shard group failed (a partner died).
    """
    due = live.control.reform_due
    flag = torch.tensor([1 if due else 0], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=shards.group)
    if due or not flag.item():
        return
    deadline = clock() + REFORM_WAIT
    while not live.control.reform_due and clock() < deadline:
        time.sleep(0.002)


def _slot_numel(param: torch.Tensor, size: int) -> int:
    """The most elements any shard index holds of ``param`` (FSDP2 shards dim 0 in chunks)."""
    if not isinstance(param, DTensor) or param.dim() == 0:
        return param.numel()
    rows = -(-param.shape[0] // size)
    return rows * (param.numel() // max(1, param.shape[0]))


class ShardState:
    """A sharded module's state as a heal sends it: ``{name: local shard}``; applying one
    copies each received shard into the parameter's or buffer's local tensor.

    Raises (``load_state_dict``):
        LiveRecoveryError: a name is missing, or a shard's shape differs from this rank's.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: _local(value).detach() for name, value in self.module.state_dict().items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        mine = self.module.state_dict()
        if set(state) != set(mine):
            raise LiveRecoveryError(f"the received shards name {sorted(set(state) ^ set(mine))[:4]} differently from this module")
        with torch.no_grad():
            for name, value in mine.items():
                local = _local(value)
                if tuple(state[name].shape) != tuple(local.shape):
                    raise LiveRecoveryError(f"the received shard of {name} is {tuple(state[name].shape)}, "
                                            f"this rank's {tuple(local.shape)}: another shard layout")
                local.copy_(state[name])


class OptimizerShardState:
    """An optimizer of sharded parameters as a heal sends it: its ``state_dict()`` with each
    DTensor replaced by its local tensor; applying one wraps each tensor shaped like its
    parameter's shard back into a DTensor of the parameter's mesh and placements."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        state = self.optimizer.state_dict()
        return {"state": {pid: {key: _local(value) for key, value in entry.items()} for pid, entry in state["state"].items()},
                "param_groups": state["param_groups"]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        entries = {}
        for pid, entry in state["state"].items():
            param = params[int(pid)]
            entries[int(pid)] = {key: _as_param_shard(value, param) for key, value in entry.items()}
        self.optimizer.load_state_dict({"state": entries, "param_groups": state["param_groups"]})


def _as_param_shard(value: Any, param: torch.Tensor) -> Any:
    if isinstance(param, DTensor) and isinstance(value, torch.Tensor) and value.shape == param.to_local().shape and value.dim() > 0:
        return DTensor.from_local(value, param.device_mesh, param.placements, run_check=False,
                                  shape=param.shape, stride=param.stride())
    return value


def shard_checksum(module: torch.nn.Module) -> str:
    """A hex digest of this rank's local shards (parameters and buffers, by name)."""
    digest = hashlib.sha256()
    for name, value in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(_local(value).detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]
