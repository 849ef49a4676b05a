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
        put_and_claim_if = KVBackend.put_and_claim_if
        put_if_and_delete = KVBackend.put_if_and_delete

    backend.__class__ = TwoWriteClaims
    return backend


class TestDefaultPutAndClaim:
    """The contract's claim tests against the base class's step-by-step ``put_and_claim(_if)``."""

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
    test_guarded_claims = BackendContract.test_put_and_claim_if_writes_only_when_every_guard_holds_and_always_reads
    test_guarded_claim_on_a_lost_lease = BackendContract.test_put_and_claim_if_on_an_unknown_lease_writes_nothing
    test_put_if_and_delete = BackendContract.test_put_if_and_delete_deletes_only_when_the_put_applies_and_at_its_revision
