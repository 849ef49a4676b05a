"""The built-in TCP store passes the backend contract suite over real loopback sockets."""

import pytest

from elastic.testing.contract import BackendContract
from elastic.testing.tcp_store import TcpStoreHarness


class TestTcpStoreContract(BackendContract):
    @pytest.fixture
    def harness(self):
        harness = TcpStoreHarness()
        yield harness
        harness.close()
