"""Static stability of the rendezvous on the in-memory store: an outage delays, never ends, a join
or a round (DESIGN §3.10). The chaos suite (tests/chaos) does the same against real etcd."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from backends.errors import BackendTimeoutError
from backends.fake import InMemoryStore
from backends.retry import RetryPolicy
from elastic.rendezvous.api import MembershipChange, MembershipStatus
from elastic.rendezvous.handler import NodeSpec, RendezvousHandler
from elastic.rendezvous.settings import RendezvousSettings

pytestmark = pytest.mark.slow

TTL = 2.0
FAST_RETRY = RetryPolicy(max_attempts=2**31, initial_backoff=0.05, max_backoff=0.2)


@pytest.fixture
def store():
    store = InMemoryStore()
    yield store
    store.close()


@pytest.fixture
def make_node(store):
    namespace = f"/outage-{uuid.uuid4().hex[:8]}"
    opened = []

    def make(nodes=2, backend=None, **options):
        settings = RendezvousSettings("job", nodes, nodes, namespace=namespace,
                                      **{"lease_ttl": TTL, "last_call_timeout": 0.2, "join_timeout": 20.0, **options})
        handler = RendezvousHandler(settings, backend or store.client(), NodeSpec("127.0.0.1"), owns_backend=True,
                                    retry=FAST_RETRY)
        opened.append(handler)
        return handler

    yield make
    for handler in opened:
        handler.shutdown()


def wait_for_change(handler, timeout) -> MembershipStatus:
    """The handler's membership once it saw a change, or as it is after ``timeout`` seconds."""
    seen = threading.Event()
    handler.on_change(seen.set)
    deadline = time.monotonic() + timeout
    while (status := handler.membership()).change is None and (left := deadline - time.monotonic()) > 0:
        seen.wait(left)
        seen.clear()
    return status


def test_a_join_outlives_an_outage_of_several_ttls_and_completes_when_the_store_returns(store, make_node):
    first, second = make_node(), make_node()
    with ThreadPoolExecutor(2) as pool:
        waiting = pool.submit(first.next_rendezvous)
        time.sleep(0.3)
        store.stop()
        time.sleep(3 * TTL)
        store.start(renew_leases=True)
        joining = pool.submit(second.next_rendezvous)
        infos = [waiting.result(timeout=20), joining.result(timeout=20)]
    assert sorted(info.group_rank for info in infos) == [0, 1]
    assert {info.round for info in infos} == {0}


def test_a_running_round_outlives_an_outage_longer_than_the_ttl_without_a_membership_change(store, make_node):
    handlers = [make_node(), make_node()]
    with ThreadPoolExecutor(2) as pool:
        infos = list(pool.map(lambda handler: handler.next_rendezvous(), handlers))
    store.stop()
    time.sleep(3 * TTL)
    store.start(renew_leases=True)  # a new leader: every lease survives
    time.sleep(2 * TTL)  # the watches resume; keepalives answer again
    assert [handler.membership().change for handler in handlers] == [None] * 2
    store.client().delete(handlers[1].keys.node(infos[1].round, handlers[1].node_id))  # the server's word still
    assert wait_for_change(handlers[0], 5).change is MembershipChange.MEMBER_LOST     # arrives on the resumed watch


def test_a_member_whose_lease_the_server_expired_during_the_outage_is_lost_when_it_returns(store, make_node):
    handlers = [make_node(), make_node()]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda handler: handler.next_rendezvous(), handlers))
    store.stop()
    time.sleep(2 * TTL)
    store.start()  # the store's clock ran on: both leases are overdue
    assert wait_for_change(handlers[0], 5).change is MembershipChange.MEMBER_LOST


class _CloseLostInFlight:
    """Applies the first close transaction but reports a timeout, as a reply lost in flight would."""

    def __init__(self, backend):
        self._backend = backend
        self.lost = threading.Event()

    def txn(self, txn):
        result = self._backend.txn(txn)
        if not self.lost.is_set() and any(getattr(op, "key", "").endswith("state/round") for op in txn.on_success):
            self.lost.set()
            raise BackendTimeoutError("txn: no answer within 5s (injected)")
        return result

    def __getattr__(self, name):
        return getattr(self._backend, name)


def test_a_close_whose_answer_was_lost_is_found_applied_and_the_closer_is_included(store, make_node, caplog):
    backend = _CloseLostInFlight(store.client())
    closer = make_node(nodes=1, backend=backend)
    with caplog.at_level(logging.WARNING, logger="elastic.rendezvous.joining"):
        info = closer.next_rendezvous()
    assert backend.lost.is_set()
    assert (info.round, info.group_rank, info.group_world_size) == (0, 0, 1)
    assert "starting over" in caplog.text


def test_corrupt_state_seen_on_a_watch_is_reported_once_and_keeps_the_round(store, make_node, caplog):
    handlers = [make_node(), make_node()]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda handler: handler.next_rendezvous(), handlers))
    with caplog.at_level(logging.ERROR, logger="elastic.rendezvous.monitor"):
        store.client().put(handlers[0].keys.round, b"garbage")
        deadline = time.monotonic() + 5
        while handlers[0]._monitor.problem is None and time.monotonic() < deadline:
            time.sleep(0.02)
    assert handlers[0].keys.round in handlers[0]._monitor.problem
    assert (handlers[0].membership().change, handlers[0].membership().reason) == (None, "")
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR and record.exc_info is None]
    assert len([r for r in errors if handlers[0].keys.round in r.getMessage()]) == 2  # one line per member


def test_a_member_stops_training_blind_once_the_outage_reaches_store_outage_timeout(store, make_node):
    handlers = [make_node(store_outage_timeout=1.0), make_node(store_outage_timeout=1.0)]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda handler: handler.next_rendezvous(), handlers))
    store.stop()
    status = wait_for_change(handlers[0], 5)
    change, reason = status.change, status.reason
    assert change is MembershipChange.STORE_UNREACHABLE and "store_outage_timeout=1s" in reason
    store.start(renew_leases=True)


def test_closing_the_rendezvous_waits_out_an_outage_instead_of_failing(store, make_node):
    handler = make_node(nodes=1)
    handler.next_rendezvous()
    store.stop()
    timer = threading.Timer(1.0, lambda: store.start(renew_leases=True))
    timer.start()
    try:
        handler.set_closed()
    finally:
        timer.join()
    assert handler.is_closed()
