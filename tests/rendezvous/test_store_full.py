"""A store that refuses writes for lack of space (etcd's NOSPACE alarm) delays a join, never ends it
before store_outage_timeout, and leaves the rendezvous state consistent (issue 27 item 2).

:class:`FullStore` refuses writes as etcd 3.4 does under the alarm: a put, a lease grant, and a
transaction with a put among its *top-level* operations (etcd's ``costTxn`` counts only those),
so the guarded join's nested put goes through while the close is refused. The chaos suite
(tests/chaos/test_store_faults.py) does the same against a real etcd filled to its quota.
"""

from __future__ import annotations

import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from backends.api import NO_LEASE
from backends.counting import CountingBackend
from backends.errors import StoreFullError
from backends.fake import InMemoryStore
from backends.retry import RetryPolicy
from backends.txn import Put, Txn
from elastic.rendezvous.handler import NodeSpec, RendezvousHandler
from elastic.rendezvous.settings import RendezvousSettings
from elastic.rendezvous.store_full import refusal_deadline

FAST_RETRY = RetryPolicy(max_attempts=2**31, initial_backoff=0.05, max_backoff=0.2)


class FullStore(CountingBackend):
    """Refuses what etcd 3.4 refuses while ``full`` is set (see the module docstring)."""

    def __init__(self, inner, state: dict) -> None:
        super().__init__(inner, owns_inner=True)
        self.state = state

    def _refuse(self, what: str) -> None:
        if self.state["full"]:
            self.state["refused"].append(what)
            raise StoreFullError(f"etcd {what} was refused: etcd is out of space (etcdserver: mvcc: database space "
                                 f"exceeded). Free space: etcdctl compact, etcdctl defrag, etcdctl alarm disarm.")

    def put(self, key: str, value: bytes, *, lease: int = NO_LEASE) -> int:
        self._refuse(f"put {key}")
        return super().put(key, value, lease=lease)

    def txn(self, txn: Txn):
        if any(isinstance(op, Put) for op in (*txn.on_success, *txn.on_failure)):
            self._refuse("txn")
        return super().txn(txn)

    def grant(self, ttl: float):
        self._refuse("grant")
        return super().grant(ttl)


@pytest.fixture
def store():
    store = InMemoryStore()
    yield store
    store.close()


def test_a_failure_restart_during_a_full_store_re_forms_once_it_has_space_past_the_join_timeout(store, caplog):
    caplog.set_level(logging.WARNING)
    state = {"full": False, "refused": []}
    settings = RendezvousSettings("job", 2, 2, namespace=f"/full-{uuid.uuid4().hex[:8]}", lease_ttl=2.0,
                                  last_call_timeout=0.2, join_timeout=1.0, store_outage_timeout=30.0)
    handlers = [RendezvousHandler(settings, FullStore(store.client(), state), NodeSpec("127.0.0.1"), owns_backend=True,
                                  retry=FAST_RETRY) for _ in range(2)]
    try:
        with ThreadPoolExecutor(2) as pool:
            first = list(pool.map(lambda handler: handler.next_rendezvous(), handlers))
            assert {info.round for info in first} == {0}
            state["full"] = True
            handlers[0].report_failure(time.time())
            joins = [pool.submit(handler.next_rendezvous) for handler in handlers]
            time.sleep(3.0)  # three join timeouts
            assert not any(join.done() for join in joins), [join.exception() for join in joins if join.done()]
            assert state["refused"], "the store refused nothing: the test does not test the alarm"
            assert all(handler.membership().store_full for handler in handlers)
            state["full"] = False
            infos = [join.result(timeout=20) for join in joins]
        assert {info.round for info in infos} == {1}
        assert sorted(info.group_rank for info in infos) == [0, 1]
        assert {info.restart_count for info in infos} == {1}  # the failure is counted once, by both
        assert not any(handler.membership().store_full for handler in handlers)
    finally:
        for handler in handlers:
            handler.shutdown()
    said = [record.getMessage() for record in caplog.records if "etcd is out of space for" in record.getMessage()]
    assert len(said) == 2, said  # once per node in 3 s, then every 30 s
    assert all("etcdctl alarm disarm" in line for line in said)
    assert sum("accepts writes again" in record.getMessage() for record in caplog.records) == 2


def test_a_join_refused_for_space_ends_store_outage_timeout_after_the_first_refusal_not_before():
    assert refusal_deadline(join_deadline=100.0, refused_since=50.0, outage_timeout=900.0) == 950.0
    assert refusal_deadline(join_deadline=2000.0, refused_since=50.0, outage_timeout=900.0) == 2000.0
