"""The distributed autograd graph of one step, across workers: read from what torch records, rendered.

    with rpc.distributed_step() as step:
        loss = ...
        graph = rpc.autograd_graph(loss)
        print(graph.text()); open("step.dot", "w").write(graph.dot())

Each worker walks its own part (from the local roots and from its send functions); the parts
are joined by matching each recv to the send of the same message id. torch's private API is
read through :mod:`rpc.introspect`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from rpc.errors import IntrospectionError
from rpc.introspect import context_method, find_context, id_text, reach, short_name, split_id, this_worker_id

if TYPE_CHECKING:
    import torch
    from torch.distributed.rpc import WorkerInfo

__all__ = ["AutogradGraph", "GraphNode", "autograd_graph"]



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
                    label += f"  send msg {id_text(node.message_id)}"
                    label += f" to {self._worker(to)}" if to is not None else ""
                elif node.kind == "recv":
                    label += f"  recv msg {id_text(node.message_id)} from {self._worker(split_id(node.message_id)[0])}"
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
                    label += f"\\n{node.kind} msg {id_text(node.message_id)}"
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
            out.append(f'  "{recv}" -> "{send}" [style=dashed, label="msg {id_text(message)}"];')
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

    context = find_context(context_id)
    cid = context_method(context, "_context_id")()
    root_fns = [tensor.grad_fn for tensor in roots if tensor.grad_fn is not None]
    local = _graph_part(cid, root_fns)
    parts = reach(local.worker_id, local, lambda worker: trpc.rpc_sync(worker, _graph_part, (cid,)), _part_neighbours)

    nodes = tuple(node for _, part in sorted(parts.items()) for node in part.nodes)
    sends = {node.message_id: node.key for node in nodes if node.kind == "send"}
    rpc_edges = []
    for node in nodes:
        if node.kind == "recv":
            if node.message_id not in sends:
                raise IntrospectionError(
                    f"Context {cid}: the recv of message {id_text(node.message_id)} on worker id {node.worker_id} "
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
    context = find_context(context_id)
    worker_id = this_worker_id()
    sends = context_method(context, "_send_functions")()
    recvs = context_method(context, "_recv_functions")()
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
            name = short_name(fn)
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
    known = tuple(sorted(context_method(context, "_known_worker_ids")()))
    return _GraphPart(worker_id, tuple(nodes), tuple(edges), tuple(dict.fromkeys(roots)), known)


def _worker_infos() -> list[WorkerInfo]:
    from rpc.lookup import worker_infos

    return worker_infos()


def _detail(fn: Any) -> str:
    variable = getattr(fn, "variable", None)
    return f"{list(variable.shape)}" if variable is not None else ""


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
