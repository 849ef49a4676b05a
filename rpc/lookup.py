"""Find workers of the running RPC group by role and role rank.

Names are ``f"{role}{role_rank}"`` (:func:`rpc.env.worker_name`); the group's members are read
from the local RPC agent (``get_worker_infos``), so roles of other sizes are found too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rpc.env import parse_worker_name, worker_name
from rpc.errors import RpcError, RpcNotStartedError, WorkerLookupError

if TYPE_CHECKING:
    from torch.distributed.rpc import WorkerInfo

__all__ = ["roles", "worker", "worker_infos", "workers"]


def worker_infos() -> list[WorkerInfo]:
    """Every worker of the group, by RPC rank (worker id).

    Raises:
        RpcNotStartedError: RPC is not started in this process.
        RpcError: torch no longer exposes the agent the way 2.13 does.
    """
    import torch
    import torch.distributed.rpc as trpc

    is_set = getattr(trpc, "_is_current_rpc_agent_set", None)
    agent = getattr(trpc, "_get_current_rpc_agent", None)
    if is_set is None or agent is None:
        raise RpcError(f"torch {torch.__version__} no longer exposes the current RPC agent "
                       "(_is_current_rpc_agent_set / _get_current_rpc_agent); rpc.lookup needs updating.")
    if not is_set():
        raise RpcNotStartedError("RPC is not started in this process: call rpc.start() first.")
    return sorted(agent().get_worker_infos(), key=lambda info: info.id)


def worker(role: str, role_rank: int) -> WorkerInfo:
    """The worker ``role_rank`` of ``role``.

    Raises:
        WorkerLookupError: no such worker; the message lists the roles and their sizes.
        RpcNotStartedError: RPC is not started.
    """
    name = worker_name(role, role_rank)
    for info in worker_infos():
        if info.name == name:
            return info
    raise WorkerLookupError(f"No worker is named {name!r} (role {role!r}, rank {role_rank}); {_roles_text()}.")


def workers(role: str) -> list[WorkerInfo]:
    """All workers of ``role``, by role rank.

    Raises:
        WorkerLookupError: the role has no worker; the message lists the roles there are.
        RpcNotStartedError: RPC is not started.
    """
    found = []
    for info in worker_infos():
        parsed = parse_worker_name(info.name)
        if parsed is not None and parsed[0] == role:
            found.append((parsed[1], info))
    if not found:
        raise WorkerLookupError(f"No worker has the role {role!r}; {_roles_text()}.")
    return [info for _, info in sorted(found, key=lambda pair: pair[0])]


def roles() -> dict[str, int]:
    """Each role of the group and how many workers it has (names not made by us are skipped)."""
    counts: dict[str, int] = {}
    for info in worker_infos():
        parsed = parse_worker_name(info.name)
        if parsed is not None:
            counts[parsed[0]] = counts.get(parsed[0], 0) + 1
    return counts


def _roles_text() -> str:
    found = roles()
    if not found:
        return "the group has no role-named workers"
    return "roles: " + ", ".join(f"{role} ({count})" for role, count in sorted(found.items()))
