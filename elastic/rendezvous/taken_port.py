"""A c10d endpoint whose port another process on this node holds: is that process our store?

A c10d node whose address is the endpoint's hosts the rendezvous store there; when the port is
taken, it connects to whoever holds it, as torchrun does, because that is normally the store
of another agent on the same machine. When the holder is something else (a web server, a
forgotten ``nc -l``, a store of another program), waiting cannot help: the node used to repeat
a 300-character warning every ~12 s for the whole join timeout (600 s). One connection tells
the two apart: an elastic-store answers the handshake at once; anything else answers in
another protocol, closes the connection, or stays silent past the dial timeout. Only a
refused connection (the holder closed its port meanwhile, e.g. an agent that just left) is
left to the usual wait.

:func:`not_a_store` is the pure verdict on that one connection's error, :func:`taken_port_message`
the line the node then fails with.
"""

from __future__ import annotations

from backends.errors import BackendConnectionError, BackendError, BackendTimeoutError, ProtocolError

__all__ = ["not_a_store", "taken_port_message"]


def not_a_store(error: BackendError, dial_timeout: float) -> str | None:
    """What the process holding the port did that no elastic-store does, or None when the error
    leaves it open (a refused connection: nothing listens any more; an auth error: it is a store).

    ====================================  ===============================================
    the one connection                    verdict
    ====================================  ===============================================
    no handshake answer in time           ``it did not answer the store's handshake ...``
    an answer in another protocol         ``it answered in another protocol``
    accepted, then closed or reset        ``it closed the connection without ...``
    refused (cause ``ConnectionRefused``)  None: wait for the store as usual
    anything else (auth, ...)             None: the caller raises it as it is
    ====================================  ===============================================
    """
    if isinstance(error, BackendTimeoutError):
        return f"it did not answer the store's handshake within {dial_timeout:g}s"
    if isinstance(error, ProtocolError):
        return "it answered in another protocol"
    if isinstance(error, BackendConnectionError) and not isinstance(error.__cause__, ConnectionRefusedError):
        return "it closed the connection without the store's handshake"
    return None


def taken_port_message(run_id: str, node: str, netloc: str, reason: str) -> str:
    """The one line a c10d host fails with when its port is held by something that is no store."""
    return (f"Rendezvous {run_id} (node {node}): cannot host the c10d store on {netloc}: another process on this "
            f"node holds the port and is not an elastic-store ({reason}). Stop that process, or choose a free "
            "port in --rdzv-endpoint.")
