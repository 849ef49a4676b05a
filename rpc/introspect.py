"""What distributed autograd records for a step, which torch keeps private: read and rendered.

Per the design of torch's distributed autograd, every RPC that carries tensors requiring grad
inside a context adds a ``SendRpcBackward`` function on the sender and a ``RecvRpcBackward`` on
the receiver, both keyed by the same ``autograd_message_id``; context and message ids are
64-bit with the creating worker's id in the top 16 bits and a per-worker counter below.

    with rpc.distributed_step() as step:
        loss = ...
        info = rpc.describe_context()            # this worker's sends, recvs, known workers
        infos = rpc.describe_all_contexts()      # the same on every worker the context reached
        graph = rpc.autograd_graph(loss)         # the graph across workers (rpc.graph)
        print(graph.text()); open("step.dot", "w").write(graph.dot())

torch exposes this only through private names (``_current_context``, ``_retrieve_context``,
``DistAutogradContext._send_functions`` / ``_recv_functions`` / ``_known_worker_ids``). They
are looked up in one place (:func:`_api`, :func:`context_method`); if a torch release renames
or drops one, every function here raises :class:`~rpc.errors.IntrospectionError` naming it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from rpc.errors import IntrospectionError

if TYPE_CHECKING:
    from torch.distributed.rpc import WorkerInfo

__all__ = [
    "ContextInfo",
    "RpcFunction",
    "describe_all_contexts",
    "describe_context",
    "describe_remote_context",
    "split_id",
]

COUNTER_BITS = 48
_COUNTER_MASK = (1 << COUNTER_BITS) - 1


def split_id(autograd_id: int) -> tuple[int, int]:
    """``(worker_id, counter)`` of a context or message id: top 16 bits and low 48 bits.

    Raises:
        ValueError: the id is not a 64-bit non-negative integer.
    """
    if not 0 <= autograd_id < 1 << 64:
        raise ValueError(f"A distributed autograd id ({autograd_id}) must be a non-negative 64-bit integer.")
    return autograd_id >> COUNTER_BITS, autograd_id & _COUNTER_MASK


def id_text(autograd_id: int) -> str:
    """A context or message id as ``worker:counter``."""
    worker, counter = split_id(autograd_id)
    return f"{worker}:{counter}"


# -- what one worker's context holds ------------------------------------------------------------


@dataclass(frozen=True)
class RpcFunction:
    """One send or recv autograd function of a context."""

    message_id: int
    kind: str  # "send" or "recv"
    name: str  # "SendRpcBackward" / "RecvRpcBackward"

    @property
    def sender(self) -> int:
        """The worker that sent the message (it made the id)."""
        return split_id(self.message_id)[0]

    @property
    def counter(self) -> int:
        return split_id(self.message_id)[1]


@dataclass(frozen=True)
class ContextInfo:
    """A context as one worker (``worker_id``) holds it."""

    context_id: int
    worker_id: int
    creator_id: int
    counter: int
    sends: tuple[RpcFunction, ...]
    recvs: tuple[RpcFunction, ...]
    known_workers: tuple[int, ...]


def describe_context(context_id: int | None = None) -> ContextInfo:
    """This worker's view of a context (default: the current one of this thread).

    Raises:
        IntrospectionError: no such context here (none active, or already released), or torch's
            private API changed.
    """
    context = find_context(context_id)
    cid = context_method(context, "_context_id")()
    creator, counter = split_id(cid)
    return ContextInfo(
        context_id=cid,
        worker_id=this_worker_id(),
        creator_id=creator,
        counter=counter,
        sends=_functions(context_method(context, "_send_functions")(), "send"),
        recvs=_functions(context_method(context, "_recv_functions")(), "recv"),
        known_workers=tuple(sorted(context_method(context, "_known_worker_ids")())),
    )


def describe_remote_context(worker: str | int | WorkerInfo, context_id: int) -> ContextInfo:
    """``worker``'s view of context ``context_id`` (an RPC without tensors: it records nothing).

    Raises IntrospectionError (from the worker) as :func:`describe_context`.
    """
    import torch.distributed.rpc as trpc

    return trpc.rpc_sync(worker, describe_context, (context_id,))


def describe_all_contexts(context_id: int | None = None) -> dict[int, ContextInfo]:
    """The context on this worker and on every worker it reached, transitively, by worker id."""
    local = describe_context(context_id)
    infos = reach(local.worker_id, local, lambda worker: describe_remote_context(worker, local.context_id),
                  _neighbours)
    return dict(sorted(infos.items()))


_Found = TypeVar("_Found")


def reach(
    worker_id: int, local: _Found, fetch: Callable[[int], _Found], neighbours: Callable[[_Found], list[int]]
) -> dict[int, _Found]:
    """``local`` and what ``fetch`` returns for every worker reachable from it through
    ``neighbours``, breadth first, each worker fetched once; by worker id."""
    found = {worker_id: local}
    pending = deque(neighbours(local))
    while pending:
        worker = pending.popleft()
        if worker not in found:
            found[worker] = fetch(worker)
            pending.extend(neighbours(found[worker]))
    return found


def _neighbours(info: ContextInfo) -> list[int]:
    return [*info.known_workers, *(function.sender for function in info.recvs)]


def _functions(functions: dict[int, Any], kind: str) -> tuple[RpcFunction, ...]:
    return tuple(RpcFunction(int(mid), kind, short_name(fn)) for mid, fn in sorted(functions.items()))


# -- torch's private API, in one place ----------------------------------------------------------


def _api(name: str) -> Any:
    import torch
    import torch.distributed.autograd as dist_autograd

    function = getattr(dist_autograd, name, None)
    if function is None:
        raise IntrospectionError(
            f"torch {torch.__version__} has no torch.distributed.autograd.{name}; rpc.introspect was "
            "written against torch 2.13 and needs updating."
        )
    return function


def context_method(context: Any, name: str) -> Any:
    """The private method ``name`` of a ``DistAutogradContext``.

    Raises:
        IntrospectionError: torch's context has no such method (a torch release changed it).
    """
    method = getattr(context, name, None)
    if method is None:
        import torch

        raise IntrospectionError(
            f"torch {torch.__version__}'s DistAutogradContext has no {name}(); rpc.introspect was "
            "written against torch 2.13 and needs updating."
        )
    return method


def find_context(context_id: int | None) -> Any:
    """torch's ``DistAutogradContext`` ``context_id`` on this worker (None: this thread's current one).

    Raises:
        IntrospectionError: no such context here, or torch's private API changed.
    """
    try:
        if context_id is None:
            return _api("_current_context")()
        return _api("_retrieve_context")(context_id)
    except RuntimeError as error:
        which = "No distributed autograd context is active on this thread" if context_id is None else (
            f"This worker has no distributed autograd context {context_id} (never reached it, or released)")
        detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise IntrospectionError(f"{which}: {detail}") from error


def this_worker_id() -> int:
    """This worker's RPC id."""
    import torch.distributed.rpc as trpc

    return trpc.get_worker_info().id


def short_name(fn: Any) -> str:
    """An autograd function's name without its C++ namespace (``SendRpcBackward``)."""
    name = fn.name() if hasattr(fn, "name") else type(fn).__name__
    return name.rsplit("::", 1)[-1]
