"""Settings of live recovery in a worker, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass

from elastic.worker.errors import LiveOptionsError

__all__ = ["LiveOptions"]


@dataclass(frozen=True)
class LiveOptions:
    """How a worker forms, waits and heals. Times are seconds.

    Attributes:
        backend: ``"gloo"`` or ``"nccl"``; ``None`` picks nccl when CUDA is available, else gloo.
            Under a live agent NCCL is refused at start unless ``ELASTIC_LIVE_NCCL=1``
            (:mod:`elastic.worker.backend`).
        collective_timeout: the process group's own timeout for one collective. It bounds how
            long an abandoned group (hung on a frozen peer) keeps its threads and sockets, and
            how long a peer may legitimately lag before its collective counts as failed.
        store_timeout: the round store client's timeout (connect, and each key wait of the
            process group's own rendezvous).
        form_timeout: the longest a worker tries to form one round (store, barrier, group, heal)
            before it gives up and exits non-zero; a newer round restarts the clock.
        round_wait_timeout: after its group is lost, the longest a worker waits for a newer round.
        interrupt_grace: while a newer round is pending, a collective in flight this long is
            abandoned (see :func:`elastic.worker.decisions.interrupt_due`); keep it below the
            agent's lease TTL.
        init_sync: at step 0, send rank 0's state to every rank.
        max_header_bytes: the largest state header a worker accepts from a peer.
        max_state_bytes: the most bytes of tensors a worker accepts in a state from a peer;
            ``None`` (the default): the memory available on the wire device (the system's, or
            the CUDA device's) when the header arrives.
        coalesce_bytes: tensors smaller than this travel packed into chunks of this size.
        drain_timeout: at :meth:`close`, the longest to wait for abandoned collectives to end
            (a process that exits while one is hung is aborted by gloo).
        regroup_window: when not every rank of a round (or of a generation) is there, how long a
            formation waits after the first rank holding the training state arrives before it
            closes with the ranks present; the others (a replacement still starting, a joining
            node's workers) join at a later step boundary. Survivors of a failure arrive within
            milliseconds of each other, and agents publish a round within tens of milliseconds
            of each other on a LAN: raise it when they learn of rounds further apart (a slow
            link to etcd), or a survivor arrives late and costs one more re-forming.
        max_failed_rounds: how many groups in a row may fail (a collective or the forming
            fails; a newer round superseding one does not count) before a step commits; past
            it the worker gives up and exits non-zero, so the agent's restart, counted against
            ``--max-restarts``, takes over. It ends a loop of rounds that break as soon as they
            form (peers that reach the rendezvous but not each other).
        seed: the seed every attempt of a step seeds the random generators from, with the step
            and the live rank (:mod:`elastic.worker.rng`), so a joiner and a step run again draw
            what the rank would have; it travels in a heal. ``None``: the generators are left
            alone (a joiner's then differ from its peers').
        hsdp: HSDP's layout (:mod:`elastic.worker.hsdp`): a node's workers are one replica,
            sharded over their own fixed group; a group forms with whole replicas only, and a
            heal sends each shard index's state from a rank with that index (its local rank).
            Every node must run the same number of workers.
    """

    backend: str | None = None
    collective_timeout: float = 60.0
    store_timeout: float = 10.0
    form_timeout: float = 60.0
    round_wait_timeout: float = 60.0
    interrupt_grace: float = 1.0
    init_sync: bool = True
    max_header_bytes: int = 16 * 1024 * 1024
    max_state_bytes: int | None = None
    coalesce_bytes: int = 4 * 1024 * 1024
    drain_timeout: float = 60.0
    max_failed_rounds: int = 8
    regroup_window: float = 0.1
    seed: int | None = 0
    hsdp: bool = False

    def __post_init__(self) -> None:
        if self.backend not in (None, "gloo", "nccl"):
            raise LiveOptionsError(f"The backend ({self.backend!r}) must be 'gloo', 'nccl' or None.")
        for name in ("collective_timeout", "store_timeout", "form_timeout", "round_wait_timeout", "interrupt_grace"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise LiveOptionsError(f"The {name.replace('_', ' ')} ({value!r}) must be a positive number of seconds.")
        if (isinstance(self.regroup_window, bool) or not isinstance(self.regroup_window, (int, float))
                or not math.isfinite(self.regroup_window) or self.regroup_window < 0):
            raise LiveOptionsError(f"The regroup window ({self.regroup_window!r}) must be a non-negative number of seconds.")
        if isinstance(self.drain_timeout, bool) or not isinstance(self.drain_timeout, (int, float)) or self.drain_timeout < 0:
            raise LiveOptionsError(f"The drain timeout ({self.drain_timeout!r}) must not be negative.")
        if type(self.max_failed_rounds) is not int or self.max_failed_rounds < 1:
            raise LiveOptionsError(f"max_failed_rounds ({self.max_failed_rounds!r}) must be an integer of at least 1.")
        for name in ("max_header_bytes", "coalesce_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 1024:
                raise LiveOptionsError(f"{name} ({value!r}) must be an integer of at least 1024.")
        if self.max_state_bytes is not None and (type(self.max_state_bytes) is not int or self.max_state_bytes < 1024):
            raise LiveOptionsError(f"max_state_bytes ({self.max_state_bytes!r}) must be None or an integer of at least 1024.")
        if self.seed is not None and (type(self.seed) is not int or not -2**63 <= self.seed < 2**64):
            raise LiveOptionsError(f"The seed ({self.seed!r:.40}) must be None or an integer in [-2**63, 2**64).")
        if not isinstance(self.init_sync, bool):
            raise LiveOptionsError(f"init_sync ({self.init_sync!r}) must be True or False.")
        if not isinstance(self.hsdp, bool):
            raise LiveOptionsError(f"hsdp ({self.hsdp!r}) must be True or False.")
