"""The backend contract suite: one set of tests every key-value backend must pass.

Use it by subclassing :class:`BackendContract` in a test module and providing a ``harness``
fixture that yields a :class:`~elastic.testing.harness.BackendHarness`::

    class TestMyBackendContract(BackendContract):
        @pytest.fixture
        def harness(self, my_server):
            yield MyHarness(my_server)

Each test gets its own key prefix and its own client, closed afterwards. Timing bounds are
the contract's promises (lease expiry seen within TTL + 1 s, a dead server reported within the
client's timeout), not performance measurements.

The suite is one class per part of the contract, each in its module: :mod:`.keyvalue`,
:mod:`.transactions`, :mod:`.leases`, :mod:`.watches`, :mod:`.failures`, over the shared
fixtures of :mod:`.fixtures`. :class:`BackendContract` is all of them; a backend that serves
only part of the contract may subclass those parts alone.
"""

from elastic.testing.contract.failures import FailureContract
from elastic.testing.contract.keyvalue import KeyValueContract
from elastic.testing.contract.leases import LeaseContract
from elastic.testing.contract.transactions import TransactionContract
from elastic.testing.contract.watches import WatchContract

__all__ = ["BackendContract"]


class BackendContract(KeyValueContract, TransactionContract, LeaseContract, WatchContract, FailureContract):
    """Tests of the key-value contract (see :mod:`backends.api`); subclass and add ``harness``."""
