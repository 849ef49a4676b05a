"""The backends the rendezvous tests run against: the fake, the built-in TCP store and etcd."""

from __future__ import annotations

import pytest

from elastic.testing.fake_store import FakeHarness
from elastic.testing.tcp_store import TcpStoreHarness


@pytest.fixture(params=["fake", "tcp", pytest.param("etcd", marks=pytest.mark.etcd)])
def harness(request):
    if request.param == "fake":
        harness = FakeHarness()
    elif request.param == "tcp":
        harness = TcpStoreHarness()
    else:
        from elastic.testing.etcd_server import EtcdHarness

        harness = EtcdHarness(request.getfixturevalue("etcd_server"))
    yield harness
    harness.close()
