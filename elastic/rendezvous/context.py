"""What every part of one node's rendezvous works with, bundled once: the run's settings, the
store and its keys, this node, its membership (session and ``state/`` watch) and the clock.

The handler (:mod:`elastic.rendezvous.handler`) makes one :class:`RendezvousContext` and hands
it to the parts that join, close, wait and leave (:mod:`.joining`, :mod:`.closing`,
:mod:`.round_wait`, :mod:`.gate`, :mod:`.barrier`), so each constructor names only what is its
own. As torch's ``_RendezvousContext`` does for its dynamic rendezvous.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from backends.api import KVBackend
from elastic.rendezvous.membership import Membership, default_node_id
from elastic.rendezvous.records import DEFAULT_ROLE, RendezvousKeys
from elastic.rendezvous.settings import RendezvousSettings

__all__ = ["NodeSpec", "RendezvousContext"]


@dataclass(frozen=True)
class NodeSpec:
    """What this node publishes with every join.

    Attributes:
        addr: the address other nodes use to reach this one (rank 0's becomes MASTER_ADDR).
        node_id: unique per handler (default: host, pid and a random suffix).
        local_world_size, role: this node's workers, so the round record places every worker
            of every node.

    Raises (from the constructor):
        ValueError: the local world size is below 1, or the role is empty.
    """

    addr: str
    node_id: str = field(default_factory=default_node_id)
    local_world_size: int = 1
    role: str = DEFAULT_ROLE

    def __post_init__(self) -> None:
        if self.local_world_size < 1:
            raise ValueError(f"The local world size ({self.local_world_size}) must be at least 1.")
        if not self.role:
            raise ValueError("The role must not be empty.")


@dataclass(frozen=True)
class RendezvousContext:
    """The collaborators shared by the parts of one node's rendezvous (see the module docstring).

    Attributes:
        settings: the run's settings. backend: the open key-value store. keys: the run's keys.
        node: this node. membership: its session and ``state/`` watch. clock: monotonic seconds.
    """

    settings: RendezvousSettings
    backend: KVBackend
    keys: RendezvousKeys
    node: NodeSpec
    membership: Membership
    clock: Callable[[], float]

    @property
    def node_id(self) -> str:
        return self.node.node_id
