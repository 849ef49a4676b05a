"""The etcd transport chosen through --rdzv-conf (``etcd_transport``), on a real etcd."""

from __future__ import annotations

import pytest

from elastic.rendezvous.errors import RendezvousConfigError
from elastic.rendezvous.registry import open_backend
from elastic.testing.etcd_server import ROOT_USER

pytestmark = pytest.mark.etcd


@pytest.mark.parametrize(
    "options, channel_kind",
    [({}, "BuiltinEndpointChannel"), ({"etcd_transport": "builtin"}, "BuiltinEndpointChannel"),
     ({"etcd_transport": "grpcio"}, "GrpcioEndpointChannel")],
)
def test_the_transport_option_picks_the_client_transport_and_both_work(etcd_server, options, channel_kind):
    credentials = {"user": ROOT_USER, "password": etcd_server.options.password}
    opened = open_backend("etcd", etcd_server.endpoints, {**credentials, **options})
    try:
        backend = opened.backend
        assert type(backend._connection._channels[0]).__name__ == channel_kind
        revision = backend.put("/registry-transport/k", channel_kind.encode())
        assert backend.get("/registry-transport/k").kv.mod_revision == revision
    finally:
        opened.release()


def test_an_unknown_transport_is_a_config_error_naming_the_valid_ones(etcd_server):
    with pytest.raises(RendezvousConfigError) as raised:
        open_backend("etcd", etcd_server.endpoints, {"etcd_transport": "http3"})
    assert "'http3'" in str(raised.value) and "builtin" in str(raised.value) and "grpcio" in str(raised.value)
