"""The removed ``etcd_transport`` rdzv-conf option: ``grpcio`` is accepted, anything else is one line."""

from __future__ import annotations

import pytest

from elastic.rendezvous.errors import RendezvousConfigError
from elastic.rendezvous.registry import open_backend
from elastic.testing.etcd_server import ROOT_USER

pytestmark = pytest.mark.etcd


@pytest.mark.parametrize("options", [{}, {"etcd_transport": "grpcio"}, {"etcd_transport": " GRPCIO "}])
def test_without_the_option_or_with_grpcio_the_etcd_backend_opens_and_works(etcd_server, options):
    credentials = {"user": ROOT_USER, "password": etcd_server.options.password}
    opened = open_backend("etcd", etcd_server.endpoints, {**credentials, **options})
    try:
        revision = opened.backend.put("/registry-transport/k", b"v")
        assert opened.backend.get("/registry-transport/k").kv.mod_revision == revision
    finally:
        opened.release()


@pytest.mark.parametrize("transport", ["builtin", "http3"])
def test_any_other_transport_is_a_one_line_config_error_saying_it_was_removed(etcd_server, transport):
    with pytest.raises(RendezvousConfigError) as raised:
        open_backend("etcd", etcd_server.endpoints, {"etcd_transport": transport})
    message = str(raised.value)
    assert "\n" not in message
    assert f"etcd_transport={transport} was removed" in message and "always uses grpcio" in message
