"""What distributed autograd records for a step, which torch keeps private: read and rendered.

Per the design of torch's distributed autograd, every RPC that carries tensors requiring grad
inside a context adds a ``SendRpcBackward`` function on the sender and a ``RecvRpcBackward`` on
the receiver, both keyed by the same ``autograd_message_id``; context and message ids are
64-bit with the creating worker's id in the top 16 bits and a per-worker counter below.

    with rpc.distributed_step() as step:
        loss = ...
        info = rpc.describe_context()            # this worker's sends, recvs, known workers
        infos = rpc.describe_all_contexts()      # the same on every worker the context reached
        graph = rpc.autograd_graph(loss)         # the graph across workers
        print(graph.text()); open("step.dot", "w").write(graph.dot())

torch exposes this only through private names (``_current_context``, ``_retrieve_context``,
``DistAutogradContext._send_functions`` / ``_recv_functions`` / ``_known_worker_ids``). They
are looked up in one place (:func:`_api`, :func:`_context_method`); if a torch release renames
or drops one, every function here raises :class:`~rpc.errors.IntrospectionError` naming it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, TypeVar

from rpc.errors import IntrospectionError

if TYPE_CHECKING:
    import torch
    from torch.distributed.rpc import WorkerInfo

__all__ = [
    "AutogradGraph",
    "ContextInfo",
    "GraphNode",
    "RpcFunction",
    "autograd_graph",
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


def _id_text(autograd_id: int) -> str:
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
    context = _context(context_id)
    cid = _context_method(context, "_context_id")()
    creator, counter = split_id(cid)
    return ContextInfo(
        context_id=cid,
        worker_id=_this_worker_id(),
        creator_id=creator,
        counter=counter,
        sends=_functions(_context_method(context, "_send_functions")(), "send"),
        recvs=_functions(_context_method(context, "_recv_functions")(), "recv"),
        known_workers=tuple(sorted(_context_method(context, "_known_worker_ids")())),
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
    infos = _reach(local.worker_id, local, lambda worker: describe_remote_context(worker, local.context_id),
                   _neighbours)
    return dict(sorted(infos.items()))


_Found = TypeVar("_Found")


def _reach(
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
    return tuple(RpcFunction(int(mid), kind, _short_name(fn)) for mid, fn in sorted(functions.items()))


# -- the graph across workers -------------------------------------------------------------------


@dataclass(frozen=True)
class GraphNode:
    """One autograd function on one worker. ``kind``: ``op``, ``leaf``, ``send`` or ``recv``."""

    key: str
    worker_id: int
    name: str
    kind: str
    message_id: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class _GraphPart:
    """The graph one worker holds for a context: from its roots and its send functions."""

    worker_id: int
    nodes: tuple[GraphNode, ...]
    edges: tuple[tuple[str, str], ...]
    roots: tuple[str, ...]
    known_workers: tuple[int, ...]


@dataclass(frozen=True)
class AutogradGraph:
    """The distributed autograd graph of one context: nodes on every worker, local edges
    (``next_functions``) and RPC edges (a recv to the send of the same message on its sender).

    Edges point the way the backward pass runs: from the loss towards the leaves.
    """

    context_id: int
    worker_names: dict[int, str]
    nodes: tuple[GraphNode, ...]
    edges: tuple[tuple[str, str], ...]
    rpc_edges: tuple[tuple[str, str], ...]
    roots: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def node(self, key: str) -> GraphNode:
        return self._by_key()[key]

    def _by_key(self) -> dict[str, GraphNode]:
        return {node.key: node for node in self.nodes}

    def _worker(self, worker_id: int) -> str:
        return self.worker_names.get(worker_id, f"worker id {worker_id}")

    def text(self) -> str:
        """An indented tree per worker; a node reached twice is printed once, then ``(see above)``."""
        by_key = self._by_key()
        children: dict[str, list[str]] = {}
        for parent, child in self.edges:
            children.setdefault(parent, []).append(child)
        rpc_target = dict(self.rpc_edges)
        receiver = {rpc_target[recv]: by_key[recv].worker_id for recv in rpc_target}
        creator, counter = split_id(self.context_id)
        lines = [f"distributed autograd graph of context {self.context_id} "
                 f"(created by {self._worker(creator)}, id {creator}; counter {counter})"]
        seen: set[str] = set()
        for worker_id, roots in sorted(self.roots.items()):
            lines.append(f"{self._worker(worker_id)} (id {worker_id}):")
            stack = [(key, 1) for key in reversed(roots)]
            while stack:
                key, depth = stack.pop()
                node = by_key[key]
                label = node.name + (f"  {node.detail}" if node.detail else "")
                if node.kind == "send":
                    to = receiver.get(key)
                    label += f"  send msg {_id_text(node.message_id)}"
                    label += f" to {self._worker(to)}" if to is not None else ""
                elif node.kind == "recv":
                    label += f"  recv msg {_id_text(node.message_id)} from {self._worker(split_id(node.message_id)[0])}"
                if key in seen:
                    lines.append("  " * depth + label + "  (see above)")
                    continue
                seen.add(key)
                lines.append("  " * depth + label)
                stack.extend((child, depth + 1) for child in reversed(children.get(key, [])))
        return "\n".join(lines) + "\n"

    def dot(self) -> str:
        """Graphviz DOT: one cluster per worker, RPC edges dashed and labelled with the message id."""
        out = [f'digraph "dist_autograd_context_{self.context_id}" {{',
               '  rankdir=TB;', '  node [shape=box, fontname="monospace"];']
        for worker_id in sorted({node.worker_id for node in self.nodes}):
            out.append(f'  subgraph "cluster_w{worker_id}" {{')
            out.append(f'    label="{_dot_escape(self._worker(worker_id))} (id {worker_id})";')
            for node in self.nodes:
                if node.worker_id != worker_id:
                    continue
                label = node.name
                if node.message_id is not None:
                    label += f"\\n{node.kind} msg {_id_text(node.message_id)}"
                elif node.detail:
                    label += f"\\n{_dot_escape(node.detail)}"
                style = {"send": ", style=filled, fillcolor=lightblue", "recv": ", style=filled, fillcolor=lightyellow",
                         "leaf": ", style=rounded"}.get(node.kind, "")
                out.append(f'    "{node.key}" [label="{label}"{style}];')
            out.append("  }")
        out.extend(f'  "{parent}" -> "{child}";' for parent, child in self.edges)
        by_key = self._by_key()
        for recv, send in self.rpc_edges:
            message = by_key[recv].message_id
            out.append(f'  "{recv}" -> "{send}" [style=dashed, label="msg {_id_text(message)}"];')
        out.append("}")
        return "\n".join(out) + "\n"


def autograd_graph(*roots: torch.Tensor, context_id: int | None = None) -> AutogradGraph:
    """The distributed autograd graph of a context, from local ``roots`` (e.g. the loss).

    Walks this worker's graph from the roots' ``grad_fn`` and from its send functions, then the
    graph of every worker the context reached (over RPC, from their send functions), and joins
    each recv to the send of the same message id. Call it inside the step, before the context
    ends (a released context is gone on every worker).

    Raises:
        IntrospectionError: no such context, a recv whose sender has no matching send, or torch's
            private API changed.
    """
    import torch.distributed.rpc as trpc

    context = _context(context_id)
    cid = _context_method(context, "_context_id")()
    root_fns = [tensor.grad_fn for tensor in roots if tensor.grad_fn is not None]
    local = _graph_part(cid, root_fns)
    parts = _reach(local.worker_id, local, lambda worker: trpc.rpc_sync(worker, _graph_part, (cid,)), _part_neighbours)

    nodes = tuple(node for _, part in sorted(parts.items()) for node in part.nodes)
    sends = {node.message_id: node.key for node in nodes if node.kind == "send"}
    rpc_edges = []
    for node in nodes:
        if node.kind == "recv":
            if node.message_id not in sends:
                raise IntrospectionError(
                    f"Context {cid}: the recv of message {_id_text(node.message_id)} on worker id {node.worker_id} "
                    "has no matching send on its sender."
                )
            rpc_edges.append((node.key, sends[node.message_id]))
    names = {info.id: info.name for info in _worker_infos()}
    return AutogradGraph(
        context_id=cid,
        worker_names={worker: names.get(worker, f"worker id {worker}") for worker in sorted(parts)},
        nodes=nodes,
        edges=tuple(edge for _, part in sorted(parts.items()) for edge in part.edges),
        rpc_edges=tuple(rpc_edges),
        roots={worker: part.roots for worker, part in sorted(parts.items())},
    )


def _part_neighbours(part: _GraphPart) -> list[int]:
    return [*part.known_workers, *(split_id(node.message_id)[0] for node in part.nodes if node.kind == "recv")]


def _graph_part(context_id: int, root_fns: Iterable[Any] = ()) -> _GraphPart:
    """Walk this worker's part of the graph (run locally, or on a worker over RPC)."""
    context = _context(context_id)
    worker_id = _this_worker_id()
    sends = _context_method(context, "_send_functions")()
    recvs = _context_method(context, "_recv_functions")()
    message_of = {id(fn): (int(mid), "send") for mid, fn in sends.items()}
    message_of.update({id(fn): (int(mid), "recv") for mid, fn in recvs.items()})

    keys: dict[int, str] = {}
    alive: list[Any] = []  # keeps each fn referenced, so id() stays unique during the walk
    nodes: list[GraphNode] = []
    edges: list[tuple[str, str]] = []
    queue: deque[Any] = deque()

    def key_of(fn: Any) -> str:
        if id(fn) not in keys:
            keys[id(fn)] = f"w{worker_id}n{len(keys)}"
            alive.append(fn)
            message, kind = message_of.get(id(fn), (None, ""))
            name = _short_name(fn)
            kind = kind or ("leaf" if name == "AccumulateGrad" else "op")
            nodes.append(GraphNode(keys[id(fn)], worker_id, name, kind, message, _detail(fn)))
            queue.append(fn)
        return keys[id(fn)]

    roots = [key_of(fn) for fn in root_fns]
    roots += [key_of(fn) for _, fn in sorted(sends.items())]
    while queue:
        fn = queue.popleft()
        for child, _ in getattr(fn, "next_functions", ()):
            if child is not None:
                edges.append((keys[id(fn)], key_of(child)))
    edges = list(dict.fromkeys(edges))  # a function feeding two inputs of one node is one edge
    known = tuple(sorted(_context_method(context, "_known_worker_ids")()))
    return _GraphPart(worker_id, tuple(nodes), tuple(edges), tuple(dict.fromkeys(roots)), known)


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


def _context_method(context: Any, name: str) -> Any:
    method = getattr(context, name, None)
    if method is None:
        import torch

        raise IntrospectionError(
            f"torch {torch.__version__}'s DistAutogradContext has no {name}(); rpc.introspect was "
            "written against torch 2.13 and needs updating."
        )
    return method


def _context(context_id: int | None) -> Any:
    try:
        if context_id is None:
            return _api("_current_context")()
        return _api("_retrieve_context")(context_id)
    except RuntimeError as error:
        which = "No distributed autograd context is active on this thread" if context_id is None else (
            f"This worker has no distributed autograd context {context_id} (never reached it, or released)")
        detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise IntrospectionError(f"{which}: {detail}") from error


def _this_worker_id() -> int:
    import torch.distributed.rpc as trpc

    return trpc.get_worker_info().id


def _worker_infos() -> list[WorkerInfo]:
    from rpc.lookup import worker_infos

    return worker_infos()


def _short_name(fn: Any) -> str:
    name = fn.name() if hasattr(fn, "name") else type(fn).__name__
    return name.rsplit("::", 1)[-1]


def _detail(fn: Any) -> str:
    variable = getattr(fn, "variable", None)
    return f"{list(variable.shape)}" if variable is not None else ""


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
