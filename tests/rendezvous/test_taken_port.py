"""A c10d host whose port another process holds: one connection tells a store from anything else.

The verdict is a case table; :func:`open_backend` then runs against real listeners on loopback:
the store of another agent (used, as torchrun does), and three things that are no store (one
that never answers, one that hangs up, an HTTP server), each refused in one line at once.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from typing import Callable, Iterator

import pytest

from backends.endpoints import Endpoint
from backends.errors import BackendAuthError, BackendConnectionError, BackendTimeoutError, ProtocolError
from backends.tcp.server import start_server
from elastic.rendezvous.backend_spec import Hosting, StoreSpec, Timeouts
from elastic.rendezvous.errors import RendezvousConnectionError
from elastic.rendezvous.registry import open_backend
from elastic.rendezvous.store_wait import StoreWait
from elastic.rendezvous.taken_port import not_a_store, taken_port_message


def caused_by(error: Exception, cause: BaseException) -> Exception:
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(("error", "verdict"), [
    (BackendTimeoutError("no handshake"), "it did not answer the store's handshake within 5s"),
    (ProtocolError("it answered b'HTTP/1.0 400'"), "it answered in another protocol"),
    (BackendConnectionError("closed before answering"), "it closed the connection without the store's handshake"),
    (caused_by(BackendConnectionError("reset"), ConnectionResetError(errno.ECONNRESET, "reset")),
     "it closed the connection without the store's handshake"),
    (caused_by(BackendConnectionError("refused"), ConnectionRefusedError(errno.ECONNREFUSED, "refused")), None),
    (BackendAuthError("wrong token"), None),  # a store, which refuses us: said as it is
])
def test_what_no_store_does(error, verdict):
    assert not_a_store(error, 5.0) == verdict


def test_the_line_names_the_run_the_node_the_port_and_the_fix():
    assert taken_port_message("job-1", "node-a", "127.0.0.1:29400", "it answered in another protocol") == (
        "Rendezvous job-1 (node node-a): cannot host the c10d store on 127.0.0.1:29400: another process on this node "
        "holds the port and is not an elastic-store (it answered in another protocol). Stop that process, or choose "
        "a free port in --rdzv-endpoint.")


# -- against real listeners --------------------------------------------------------------------


def c10d_at(port: int) -> StoreSpec:
    return StoreSpec("c10d", Endpoint("127.0.0.1", port), hosting=Hosting.BY_ADDRESS, timeouts=Timeouts(1.0, 5.0))


class Holder:
    """A listening socket on loopback that treats each connection with ``serve`` (None: never accepts)."""

    def __init__(self, serve: Callable[[socket.socket], None] | None) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)  # the accept loop looks at _closing between tries
        self.port = self.sock.getsockname()[1]
        self._serve = serve
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True) if serve else None
        if self._thread:
            self._thread.start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                self._serve(conn)  # type: ignore[misc]

    def close(self) -> None:
        self._closing.set()
        if self._thread:
            self._thread.join(timeout=5)
        self.sock.close()


def hang_up(conn: socket.socket) -> None:
    conn.recv(1024)


def answer_http(conn: socket.socket) -> None:
    conn.recv(1024)
    conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")


@pytest.fixture
def holder(request) -> Iterator[Holder]:
    held = Holder(request.param)
    yield held
    held.close()


@pytest.mark.parametrize(("holder", "reason"), [
    (None, "it did not answer the store's handshake within 1s"),
    (hang_up, "it closed the connection without the store's handshake"),
    (answer_http, "it answered in another protocol"),
], indirect=["holder"], ids=["silent", "hangs-up", "http"])
def test_a_port_held_by_something_else_fails_in_one_line_not_after_the_join_timeout(holder, reason):
    begun = time.monotonic()
    with pytest.raises(RendezvousConnectionError) as raised:
        open_backend(c10d_at(holder.port), StoreWait("job-1", "node-a", 600.0))
    assert str(raised.value) == taken_port_message("job-1", "node-a", f"127.0.0.1:{holder.port}", reason)
    assert time.monotonic() - begun < 60  # the dial timeout, not the 600 s join timeout


def test_a_port_held_by_another_agents_store_is_used_as_torchrun_does():
    server = start_server("127.0.0.1", 0, None)
    try:
        opened = open_backend(c10d_at(server.port), StoreWait("job-1", "node-b", 600.0))
        try:
            assert opened.hosted_endpoint is None  # it connected; it does not host
            assert opened.backend.put("/k", b"v") > 0
        finally:
            opened.release()
    finally:
        server.stop()
