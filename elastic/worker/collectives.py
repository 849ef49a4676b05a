"""The group in use and the collectives launched on it: ``LiveTraining.all_reduce``, DDP's
buckets (:mod:`elastic.worker.ddp`), and the works an abandoned group leaves running.

Every collective is launched asynchronously and guarded by the group's
:class:`~elastic.worker.guard.OpRegistry`, so a newer round or a failed peer ends the wait on it.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist

from elastic.worker.errors import GroupLost, LiveRecoveryError
from elastic.worker.group import FormedGroup, leave_group
from elastic.worker.guard import Graveyard, OpRegistry, failed_future

__all__ = ["GroupInUse"]


class GroupInUse:
    """The group this worker trains on (none between leaving one and forming the next), and the
    abandoned groups whose works still run (``label`` names the worker in errors)."""

    def __init__(self, label: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._label = label
        self._formed: FormedGroup | None = None
        self._graveyard = Graveyard(clock)

    def use(self, formed: FormedGroup) -> None:
        self._formed = formed

    @property
    def current(self) -> FormedGroup | None:
        """The group in use, if any."""
        return self._formed

    def leave(self, reason: str) -> None:
        """Leave the group in use, if any (its collectives in flight fail with ``reason``)."""
        if self._formed is not None:
            leave_group(self._formed, self._graveyard, reason)
            self._formed = None

    def require(self) -> FormedGroup:
        """The group in use.

        Raises:
            LiveRecoveryError: no group is formed (before ``start()``, or after ``close()``).
        """
        if self._formed is None:
            raise LiveRecoveryError(f"{self._label}: no group is formed (call start(); not after close()).")
        return self._formed

    def registry(self) -> OpRegistry | None:
        """The registry of the group in use, whose collectives a newer round may abandon."""
        formed = self._formed
        return None if formed is None else formed.registry

    @property
    def failure(self) -> GroupLost | None:
        """Why the group in use was lost, if a collective of it failed or was abandoned."""
        formed = self._formed
        return None if formed is None else formed.registry.failure

    def all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
        """All-reduce ``tensor`` in place over the group in use; returns it.

        Raises:
            GroupLost: the collective failed, or a newer round abandoned it.
            LiveRecoveryError: no group is formed.
        """
        formed = self.require()
        if formed.registry.failure is not None:
            raise formed.registry.failure
        work = dist.all_reduce(tensor, op=op, group=formed.group, async_op=True)
        return formed.registry.launch([work], lambda: tensor).wait()

    def bucket_allreduce(self, buffer: torch.Tensor) -> torch.futures.Future:
        """Average ``buffer`` over the group in use: the future a DDP comm hook returns (failed,
        never raising, when there is no group or it was lost)."""
        formed = self._formed
        if formed is None:
            return failed_future(LiveRecoveryError(f"{self._label}: no group is formed"))
        if formed.registry.failure is not None:
            return failed_future(formed.registry.failure)
        world = formed.world_size
        work = dist.all_reduce(buffer, group=formed.group, async_op=True)
        return formed.registry.launch([work], lambda: buffer.div_(world)).future

    @property
    def identity(self) -> tuple[int, int] | None:
        """The group in use's round and generation, if any."""
        formed = self._formed
        return None if formed is None else (formed.round.round, formed.generation)

    def abandon(self, identity: tuple[int, int], reason: str) -> int:
        """Abandon the collectives in flight on the group in use if it is ``identity`` (a peer
        outside the group saw it fail); the number abandoned."""
        formed = self._formed
        if formed is None or (formed.round.round, formed.generation) != identity:
            return 0
        return formed.registry.abandon(reason)

    def abandoned_works(self) -> int:
        """Works of abandoned groups still running; drops the groups whose works all ended."""
        return self._graveyard.reap()

    def drain(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for the abandoned works to end; the number still running."""
        return self._graveyard.drain(timeout)
