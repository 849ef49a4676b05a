"""The in-memory fake passes the backend contract suite."""

import pytest

from elastic.testing.contract import BackendContract
from elastic.testing.fake_store import FakeHarness


class TestFakeContract(BackendContract):
    @pytest.fixture
    def harness(self):
        harness = FakeHarness()
        yield harness
        harness.close()
