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


def _without_native_claim(backend):
    from backends.api import KVBackend

    class TwoWriteClaims(type(backend)):
        put_and_claim = KVBackend.put_and_claim

    backend.__class__ = TwoWriteClaims
    return backend


class TestDefaultPutAndClaim:
    """The contract's claim tests against the base class's two-write ``put_and_claim``."""

    @pytest.fixture
    def harness(self):
        harness = FakeHarness()
        yield harness
        harness.close()

    @pytest.fixture
    def backend(self, harness):
        backend = _without_native_claim(harness.connect())
        yield backend
        backend.close()

    @pytest.fixture
    def prefix(self):
        import uuid

        return f"/default-claim/{uuid.uuid4().hex[:8]}/"

    test_claims = BackendContract.test_put_and_claim_always_writes_and_claims_only_when_the_claim_is_absent
    test_races = BackendContract.test_exactly_one_of_16_racing_put_and_claims_claims_and_all_agree_on_the_holder
