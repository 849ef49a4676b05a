"""etcd client options through --rdzv-conf: the removed ``etcd_transport`` and ``max_response_bytes``."""

from __future__ import annotations

import pytest

from backends.errors import ProtocolError
from elastic.rendezvous.errors import RendezvousConfigError
from elastic.rendezvous.backend_spec import spec_from_conf
from elastic.rendezvous.registry import open_backend
from elastic.testing.etcd_server import ROOT_USER

pytestmark = pytest.mark.etcd


@pytest.mark.parametrize("options", [{}, {"etcd_transport": "grpcio"}, {"etcd_transport": " GRPCIO "}])
def test_without_the_option_or_with_grpcio_the_etcd_backend_opens_and_works(etcd_server, options):
    credentials = {"user": ROOT_USER, "password": etcd_server.options.password}
    opened = open_backend(spec_from_conf("etcd", etcd_server.endpoints, {**credentials, **options}))
    try:
        revision = opened.backend.put("/registry-transport/k", b"v")
        assert opened.backend.get("/registry-transport/k").kv.mod_revision == revision
    finally:
        opened.release()


@pytest.mark.parametrize("transport", ["builtin", "http3"])
def test_any_other_transport_is_a_one_line_config_error_saying_it_was_removed(etcd_server, transport):
    with pytest.raises(RendezvousConfigError) as raised:
        open_backend(spec_from_conf("etcd", etcd_server.endpoints, {"etcd_transport": transport}))
    message = str(raised.value)
    assert "\n" not in message
    assert f"etcd_transport={transport} was removed" in message and "always uses grpcio" in message


def test_max_response_bytes_from_rdzv_conf_bounds_the_client_and_a_bad_value_is_one_line(etcd_server):
    credentials = {"user": ROOT_USER, "password": etcd_server.options.password}
    opened = open_backend(spec_from_conf("etcd", etcd_server.endpoints, {**credentials, "max_response_bytes": "4096"}))
    try:
        assert opened.backend.config.max_response_bytes == 4096
        for index in range(40):
            opened.backend.put(f"/registry-limit/{index:02d}", b"x" * 200)
        with pytest.raises(ProtocolError, match="max_response_bytes"):
            opened.backend.get_prefix("/registry-limit/")
    finally:
        opened.release()
    for bad in ("lots", "0", str(2**31)):  # the last is over gRPC's limit, refused when the client is built
        with pytest.raises(RendezvousConfigError, match="max_response_bytes") as raised:
            open_backend(spec_from_conf("etcd", etcd_server.endpoints, {**credentials, "max_response_bytes": bad}))
        assert "\n" not in str(raised.value)
