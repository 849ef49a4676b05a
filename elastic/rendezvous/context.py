"""What every part of one node's rendezvous works with, bundled once: the run's settings, the
store and its keys, this node, its membership (session and ``state/`` watch) and the clock.

The handler (:mod:`elastic.rendezvous.handler`) makes one :class:`RendezvousContext` and hands
it to the parts that join, close, wait and leave (:mod:`.joining`, :mod:`.closing`,
:mod:`.round_wait`, :mod:`.gate`, :mod:`.barrier`), so each constructor names only what is its
own. As torch's ``_RendezvousContext`` does for its dynamic rendezvous.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from backends.api import KVBackend
from elastic.rendezvous.membership import Membership
from elastic.rendezvous.records import RendezvousKeys
from elastic.rendezvous.settings import RendezvousSettings

__all__ = ["NodeSpec", "RendezvousContext"]


@dataclass(frozen=True)
class NodeSpec:
    """What this node publishes with every join."""

    node_id: str
    addr: str
    local_world_size: int
    role: str


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
