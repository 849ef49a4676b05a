"""The static rendezvous's master port: node rank 0 listens there from set-up to exit, for its
agent's store helper, or says in one line that it cannot, before any worker starts (the line is a
case table; the rest binds real ports)."""

from __future__ import annotations

import errno
import os
import socket
from typing import Iterator

import pytest

from backends.endpoints import Endpoint
from elastic.rendezvous.backend_spec import StaticSpec
from elastic.rendezvous.errors import RendezvousConfigError
from elastic.rendezvous.ports import master_port_listener
from elastic.rendezvous.registry import create_handler
from elastic.rendezvous.settings import RendezvousSettings
from elastic.rendezvous.static import master_port_problem
from elastic.testing.ports import free_port


@pytest.mark.parametrize(("code", "nnodes", "line"), [
    (errno.EADDRINUSE, 1, "The master port 29500 is already in use on this node (node rank 0 hosts its workers' "
                          "store there); stop what holds it, or choose a free port with --master-port (or leave "
                          "it out: a single node then picks a free one)."),
    (errno.EADDRINUSE, 2, "The master port 29500 is already in use on this node (node rank 0 hosts its workers' "
                          "store there); stop what holds it, or choose a free port with --master-port."),
    (errno.EACCES, 2, "The master port 29500 cannot be used on this node (Permission denied) (node rank 0 hosts its "
                      "workers' store there); choose another port with --master-port."),
])
def test_the_line_names_the_port_why_and_the_fix(code, nnodes, line):
    assert master_port_problem(29500, OSError(code, os.strerror(code)), nnodes) == line


@pytest.fixture
def held() -> Iterator[socket.socket]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", free_port()))
    sock.listen(1)
    yield sock
    sock.close()


def test_a_port_another_process_listens_on_cannot_be_held_and_a_free_one_can(held):
    with pytest.raises(OSError) as raised:
        master_port_listener(held.getsockname()[1])
    assert raised.value.errno == errno.EADDRINUSE
    port = free_port()
    with master_port_listener(port) as listener, socket.create_connection(("127.0.0.1", port), timeout=5):
        assert listener.getsockname()[1] == port and not listener.get_inheritable()


@pytest.mark.parametrize(("node_rank", "refused"), [(0, True), (1, False)])
def test_only_node_rank_0_is_refused_a_taken_master_port(held, node_rank, refused):
    spec = StaticSpec(node_rank, Endpoint("127.0.0.1", held.getsockname()[1]))
    settings = RendezvousSettings("none", 2, 2)
    if refused:
        with pytest.raises(RendezvousConfigError, match="is already in use on this node"):
            create_handler(spec, settings, "127.0.0.1")
    else:  # its workers connect there; whether rank 0's node can listen is not known here
        assert create_handler(spec, settings, "127.0.0.1").node_id == "node1"


def test_node_rank_0_holds_the_master_port_across_rounds_and_hands_each_round_a_duplicate():
    port = free_port()
    handler = create_handler(StaticSpec(0, Endpoint("127.0.0.1", port)), RendezvousSettings("none", 1, 1),
                             "127.0.0.1")
    try:
        for round_ in (0, 1):
            info = handler.next_rendezvous()
            assert (info.round, info.master_port, info.master_listener.getsockname()[1]) == (round_, port, port)
            info.master_listener.close()  # the agent hands it to its store helper, which closes it
            with socket.create_connection(("127.0.0.1", port), timeout=5):  # still listening: the handler's own
                pass
    finally:
        handler.shutdown()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_the_other_nodes_hold_no_port():
    handler = create_handler(StaticSpec(1, Endpoint("127.0.0.1", free_port())), RendezvousSettings("none", 2, 2),
                             "127.0.0.1")
    assert handler.next_rendezvous().master_listener is None
