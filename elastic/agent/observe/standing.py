"""Where this node stands, as ``/healthz`` and the membership gauges both say it.

One :class:`Standing` (a look taken without I/O) gives ``/healthz``'s answer (:func:`health`) and
the gauges ``elastic_members``, ``elastic_nodes_waiting``, ``elastic_spares`` and
``elastic_rendezvous_joined_nodes`` (:func:`gauges`), so a scrape and a probe never tell two
stories (the gauges used to keep the last round's values while ``/healthz`` said the node was
waiting for the next one). While the node waits in a rendezvous no round runs on it: members,
waiting nodes and spares are 0 and the joined count is the round being formed's.
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic.rendezvous.api import MembershipStatus
from elastic.rendezvous.progress import WaitSnapshot

__all__ = ["MembershipGauges", "Standing", "gauges", "health"]


@dataclass(frozen=True)
class Standing:
    """One look at this node.

    Attributes:
        healthy: the agent runs (False once it stopped).
        progress: the rendezvous this node waits in (None: not waiting).
        members: nodes in the round this node last joined (0 before the first).
        membership: that round's membership as last seen (waiting nodes, spares, store outage or full).
    """

    healthy: bool
    progress: WaitSnapshot | None
    members: int = 0
    membership: MembershipStatus = MembershipStatus()


@dataclass(frozen=True)
class MembershipGauges:
    """The values of ``elastic_members``, ``elastic_nodes_waiting``, ``elastic_spares`` and
    ``elastic_rendezvous_joined_nodes``."""

    members: int
    nodes_waiting: int
    spares: int
    joined: int


def health(standing: Standing) -> tuple[bool, str]:
    """``/healthz``'s answer: stopped, waiting for a rendezvous (with its counts), or running
    (with the spares waiting beyond a full round, if any).

    A store outage, or a store out of space (etcd's NOSPACE alarm), is said but stays healthy
    (200): the workers train on without the store, and a liveness probe that restarted the pod
    would turn a control-plane outage into lost work.
    """
    if not standing.healthy:
        return False, "stopped"
    outage_age = standing.membership.store_outage
    outage = f"; store unreachable for {outage_age:.0f}s" if outage_age > 0 else ""
    if standing.membership.store_full:
        outage += "; store out of space"
    if standing.progress is not None:
        return True, f"waiting for rendezvous ({standing.progress.counts_text()}){outage}"
    spares = standing.membership.spares
    return True, (f"running; spares: {spares}" if spares else "running") + outage


def gauges(standing: Standing) -> MembershipGauges:
    """The membership gauges for ``standing``: 0 but the joined count while waiting, all 0 once stopped."""
    if not standing.healthy:
        return MembershipGauges(0, 0, 0, 0)
    if standing.progress is not None:
        return MembershipGauges(0, 0, 0, standing.progress.joined or 0)
    membership = standing.membership
    return MembershipGauges(standing.members, membership.waiting, membership.spares, 0)
