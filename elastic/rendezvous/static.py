"""``--rdzv-backend static``: fixed ranks from ``--node-rank``, no elasticity, no backend.

Every node must be started with the same ``--nnodes`` and a distinct ``--node-rank``; the
endpoint (``--rdzv-endpoint`` or ``--master-addr:--master-port``) is where the workers' store
runs. Membership never changes, so the membership signal is never set. Node rank 0 listens on the
master port from set-up (:func:`elastic.rendezvous.registry.create_handler`, one line from
:func:`master_port_problem` when it cannot) until it exits, and each round hands the agent a
duplicate of that socket: its store helper serves the workers' store there and every worker is a
client, as under torchrun, whose agent hosts that store. When rank 0's worker hosted it, the
store went down with that worker's exit while its peers could still be tearing their process
group down, and one of them was at times aborted (``terminate called without an active
exception``).
"""

from __future__ import annotations

import errno
import socket

from elastic.rendezvous.api import Rendezvous, RendezvousInfo
from elastic.rendezvous.errors import RendezvousClosedError, RendezvousConfigError
from elastic.rendezvous.records import Member


def master_port_problem(port: int, error: OSError, nnodes: int) -> str:
    """The one line for a master port that node rank 0 cannot listen on (``error`` from trying).

    Its agent hosts the workers' store there; found only when a worker bound it (as rank 0's
    once did), a taken port was a 20-line ``EADDRINUSE`` traceback and a root-cause report.
    """
    taken = error.errno == errno.EADDRINUSE
    why = "is already in use on this node" if taken else f"cannot be used on this node ({error.strerror or error})"
    fix = "stop what holds it, or choose a free port" if taken else "choose another port"
    alone = " (or leave it out: a single node then picks a free one)" if nnodes == 1 else ""
    return (f"The master port {port} {why} (node rank 0 hosts its workers' store there); {fix} with "
            f"--master-port{alone}.")


def _check(nnodes: int, node_rank: int, master_port: int) -> None:
    """Raises RendezvousConfigError for a node rank outside 0..nnodes-1 or an invalid port."""
    if nnodes < 1:
        raise RendezvousConfigError(f"The static rendezvous needs --nnodes >= 1 (got {nnodes}).")
    if not 0 <= node_rank < nnodes:
        raise RendezvousConfigError(
            f"The static rendezvous needs --node-rank between 0 and {nnodes - 1} (got {node_rank})."
        )
    if not 0 < master_port < 65536:
        raise RendezvousConfigError(f"The static rendezvous needs a master port from 1 to 65535 (got {master_port}).")


class StaticRendezvousHandler(Rendezvous):
    """The same answer every round: ``node_rank`` of ``nnodes``, master at ``master_addr:master_port``.

    ``listener``: node rank 0's socket listening on the master port, owned from now on (closed at
    :meth:`shutdown`); each round's ``master_listener`` is a duplicate, for the agent to hand to
    its store helper, so the port stays this node's between rounds. Without one, rank 0's worker
    hosts the store.

    Raises (on construction, after closing ``listener``):
        RendezvousConfigError: the node rank is outside 0..nnodes-1 or the port is invalid.
    """

    def __init__(self, run_id: str, nnodes: int, node_rank: int, master_addr: str, master_port: int,
                 listener: socket.socket | None = None) -> None:
        try:
            _check(nnodes, node_rank, master_port)
        except RendezvousConfigError:
            if listener is not None:
                listener.close()
            raise
        self._run_id = run_id
        self._nnodes = nnodes
        self._node_rank = node_rank
        self._master = (master_addr, master_port)
        self._listener = listener
        self._round = -1
        self._closed = False

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def node_id(self) -> str:
        return f"node{self._node_rank}"

    def next_rendezvous(self) -> RendezvousInfo:
        if self._closed:
            raise RendezvousClosedError(f"The static rendezvous {self._run_id} is closed.")
        self._round += 1
        members = tuple(Member(f"node{rank}", self._master[0], self._master[1]) for rank in range(self._nnodes))
        listener = self._listener.dup() if self._listener is not None else None
        return RendezvousInfo(self._run_id, self._round, self._node_rank, self._nnodes,
                              self._master[0], self._master[1], members, master_listener=listener)

    def is_closed(self) -> bool:
        return self._closed

    def set_closed(self, reason: str = "the job finished") -> None:
        self._closed = True

    def shutdown(self) -> None:
        """Close the master port (node rank 0); no backend, no keys to leave."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
