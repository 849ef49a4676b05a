"""Excluding a node whose own workers keep failing (``--rdzv-conf max_node_failures=N,exclusion_cooldown=S``).

When to exclude is :func:`elastic.agent.decisions.should_exclude` (pure); what the rendezvous
does is :meth:`elastic.rendezvous.api.Rendezvous.exclude`. Here: the policy and the reason given.
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic.agent.observe.report import exit_text
from elastic.agent.processes.failures import first_failure
from elastic.agent.processes.group_state import GroupState


@dataclass(frozen=True)
class ExclusionPolicy:
    """A node whose own workers caused ``max_node_failures`` failure restarts in a row leaves for
    ``cooldown`` seconds, while ``min_nodes`` others remain."""

    max_node_failures: int
    cooldown: float
    min_nodes: int


def exclusion_reason(policy: ExclusionPolicy, failures_in_a_row: int, state: GroupState) -> str:
    """Why the node leaves, naming the failure that made ``failures_in_a_row`` (this one included)."""
    first = first_failure(state.failures)
    cause = f"rank {first.global_rank} {exit_text(first.exitcode)}" if first else "its workers failed"
    return (f"its own workers failed {failures_in_a_row} times in a row "
            f"(max_node_failures={policy.max_node_failures}; last: {cause})")
