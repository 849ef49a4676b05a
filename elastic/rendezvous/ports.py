"""A node's master port, listening from the moment it is published.

Each join publishes the port this node's workers would meet on if it became group rank 0.
Picking a free port and binding it later leaves a window in which the port is named in the
round record but nobody listens: peers that connect then are refused and fall into
TCPStore's connect back-off (seconds), and another process may take the port meanwhile. A
:class:`PortReservation` binds and listens at once; connections that arrive before the store
runs wait in the kernel's accept queue. Whoever hosts the store takes the listening socket
(:meth:`PortReservation.take`: torch's ``TCPStore(master_listen_fd=...)``); the others close it.

The port listens on the node's published address only, when that is an address of this host:
torch's ``TCPStore`` has no authentication, so the bind is its only fence (stock torchrun
listens on every interface). When the address is not this host's (a NAT'd public address, or
a mistyped one), the port listens on every interface with one warning: refusing would break a
NAT'd setup that works under torchrun (peers reach a NAT'd address through an interface the
node cannot name), while a mistyped address fails anyway at the workers' first connect, where
the warning is the line that explains it. An address that does not resolve is refused: peers
could not resolve it either, and the node's own workers could not connect to it.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading

log = logging.getLogger(__name__)

__all__ = ["PortReservation", "master_port_listener", "reserve_port"]


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
    """Listen on a port the OS picks on ``addr``, the node's published address, when it is one
    of this host's; otherwise on all interfaces, after one warning per address (see the module).

    Raises:
        OSError: ``addr`` does not resolve (the message says to set ``--local-addr``), or no
            socket could be bound (out of ports or file descriptors).
    """
    try:
        infos = socket.getaddrinfo(addr, 0, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise OSError(f"the node address {addr[:200]!r} does not resolve here ({error.strerror}), so neither "
                      "peers nor this node's workers could reach its master port; set --local-addr to an "
                      "address of this host that the other nodes can reach") from None
    for family, _, _, _, sockaddr in infos:
        sock = _listen(family, (sockaddr[0], 0, *sockaddr[2:]), not_local_ok=True)
        if sock is not None:
            return PortReservation(sock)
    _warn_not_local(addr)
    family = infos[0][0] if infos else socket.AF_INET
    return PortReservation(_listen(family, ("::" if family == socket.AF_INET6 else "", 0)))  # type: ignore[arg-type]


def _listen(family: int, sockaddr: tuple, *, not_local_ok: bool = False) -> socket.socket | None:
    """A listening, non-inheritable socket bound to ``sockaddr``; None when ``not_local_ok`` and
    the address is not this host's (EADDRNOTAVAIL)."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(sockaddr)
        except OSError as error:
            if not_local_ok and error.errno == errno.EADDRNOTAVAIL:
                sock.close()
                return None
            raise
        sock.listen(socket.SOMAXCONN)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


def master_port_listener(port: int) -> socket.socket:
    """A listening, non-inheritable socket on ``port`` of every interface: the static rendezvous's
    master port, held by node rank 0's agent from set-up to exit (its store helper serves the
    workers' store on it, as torchrun's agent does). IPv6 and IPv4 where the host has both, as
    torch's ``TCPStore`` binds; ``SO_REUSEADDR``, so a previous store's connections in TIME_WAIT
    do not count.

    Raises:
        OSError: the port cannot be bound (EADDRINUSE: another process holds it; EACCES: a
            privileged port).
    """
    if socket.has_dualstack_ipv6():
        try:
            sock = socket.create_server(("::", port), family=socket.AF_INET6, backlog=socket.SOMAXCONN,
                                        dualstack_ipv6=True)
        except OSError as error:
            if error.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                raise
        else:
            sock.set_inheritable(False)
            return sock
    return _listen(socket.AF_INET, ("", port))  # type: ignore[return-value]


_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_not_local(addr: str) -> None:
    with _warned_lock:
        if addr in _warned:
            return
        _warned.add(addr)
    log.warning("The node address %r is not an address of this host (NAT'd, or mistyped?): the workers' "
                "master port listens on every interface, unauthenticated, as under torchrun. If peers reach "
                "this node at an address of its own, set --local-addr to it.", addr[:200])
