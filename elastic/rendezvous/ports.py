"""A node's master port, listening from the moment it is published.

Each join publishes the port this node's workers would meet on if it became group rank 0.
Picking a free port and binding it later leaves a window in which the port is named in the
round record but nobody listens: peers that connect then are refused and fall into
TCPStore's connect back-off (seconds), and another process may take the port meanwhile. A
:class:`PortReservation` binds and listens at once; connections that arrive before the store
runs wait in the kernel's accept queue. Whoever hosts the store takes the listening socket
(:meth:`PortReservation.take`: torch's ``TCPStore(master_listen_fd=...)``); the others close it.
"""

from __future__ import annotations

import socket
import threading

__all__ = ["PortReservation", "reserve_port"]


class PortReservation:
    """A bound, listening TCP socket whose port a join publishes. Thread-safe; close is idempotent."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock: socket.socket | None = sock
        self.port: int = sock.getsockname()[1]
        self._lock = threading.Lock()

    def take(self) -> socket.socket | None:
        """The listening socket, now owned by the caller; None if already taken or closed."""
        with self._lock:
            sock, self._sock = self._sock, None
            return sock

    def close(self) -> None:
        sock = self.take()
        if sock is not None:
            sock.close()

    def __repr__(self) -> str:
        return f"PortReservation(port={self.port}, open={self._sock is not None})"


def reserve_port(addr: str) -> PortReservation:
    """Listen on a port the OS picks on ``addr`` (all interfaces if ``addr`` is not local).

    Raises:
        OSError: no socket could be bound (out of ports or file descriptors).
    """
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((addr, 0))
        except OSError:
            sock.bind(("", 0))
        sock.listen(socket.SOMAXCONN)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(False)
    return PortReservation(sock)
