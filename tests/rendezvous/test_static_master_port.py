"""The static rendezvous's master port: node rank 0 says in one line that it cannot listen there,
before any worker starts (the line is a case table; the check binds a real port)."""

from __future__ import annotations

import errno
import os
import socket
from typing import Iterator

import pytest

from backends.endpoints import Endpoint
from elastic.rendezvous.backend_spec import StaticSpec
from elastic.rendezvous.errors import RendezvousConfigError
from elastic.rendezvous.ports import port_unusable
from elastic.rendezvous.registry import create_handler
from elastic.rendezvous.settings import RendezvousSettings
from elastic.rendezvous.static import master_port_problem
from elastic.testing.ports import free_port


@pytest.mark.parametrize(("code", "nnodes", "line"), [
    (errno.EADDRINUSE, 1, "The master port 29500 is already in use on this node (node rank 0's workers would host "
                          "their store there); stop what holds it, or choose a free port with --master-port (or leave "
                          "it out: a single node then picks a free one)."),
    (errno.EADDRINUSE, 2, "The master port 29500 is already in use on this node (node rank 0's workers would host "
                          "their store there); stop what holds it, or choose a free port with --master-port."),
    (errno.EACCES, 2, "The master port 29500 cannot be used on this node (Permission denied) (node rank 0's workers "
                      "would host their store there); choose another port with --master-port."),
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


def test_a_port_another_process_listens_on_is_unusable_and_a_free_one_is_not(held):
    assert port_unusable(held.getsockname()[1]).errno == errno.EADDRINUSE
    assert port_unusable(free_port()) is None


@pytest.mark.parametrize(("node_rank", "refused"), [(0, True), (1, False)])
def test_only_node_rank_0_is_refused_a_taken_master_port(held, node_rank, refused):
    spec = StaticSpec(node_rank, Endpoint("127.0.0.1", held.getsockname()[1]))
    settings = RendezvousSettings("none", 2, 2)
    if refused:
        with pytest.raises(RendezvousConfigError, match="is already in use on this node"):
            create_handler(spec, settings, "127.0.0.1")
    else:  # its workers connect there; whether rank 0's node can listen is not known here
        assert create_handler(spec, settings, "127.0.0.1").node_id == "node1"
