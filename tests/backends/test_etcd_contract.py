"""The etcd v3 backend against the shared backend contract, on a real etcd."""

from __future__ import annotations

import pytest

from elastic.testing.contract import BackendContract
from elastic.testing.etcd_server import EtcdHarness

pytestmark = pytest.mark.etcd


class TestEtcdContract(BackendContract):
    @pytest.fixture
    def harness(self, etcd_server):
        harness = EtcdHarness(etcd_server)
        yield harness
        harness.close()
