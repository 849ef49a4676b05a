"""The job's end and the job's identity in the store (issue 26 items 6 and 9), on every backend.

Item 6: the first node whose workers all succeed records ``state/finished``; after it no node
joins and no round closes, a member sees JOB_FINISHED (its round) or JOB_FINISHED_ELSEWHERE,
and recording or closing against a store that is gone gives up after the close timeout.
Item 9: the first joiner records the job's fingerprint (``state/job``); a node of another job
that reuses the run id is refused and writes nothing, so the running job sees no change.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from elastic.rendezvous.api import MembershipChange
from elastic.rendezvous.errors import JobFinishedError, JobMismatchError, RendezvousConnectionError
from elastic.rendezvous.handler import NodeSpec, RendezvousHandler, default_node_id
from elastic.rendezvous.job import decode_finished, decode_job, job_identity
from elastic.rendezvous.records import RendezvousKeys
from elastic.rendezvous.settings import RendezvousSettings
from elastic.testing.tcp_store import TcpStoreHarness

TTL = 2.0
TRAIN = job_identity("script", "train_ddp.py", ["--steps", "2000", "--checkpoint", "/nodeA/ckpt.pt"])
TRAIN_ON_B = job_identity("script", "train_ddp.py", ["--steps", "2000", "--checkpoint", "/nodeB/ckpt.pt"])
OTHER = job_identity("script", "probe.py", ["table.jsonl", "--password", "hunter2"])


@pytest.fixture
def make_node(harness):
    """Handlers on their own clients under a namespace unique to the test; all shut down after."""
    namespace = f"/outcome-test-{uuid.uuid4().hex[:10]}"
    opened: list[RendezvousHandler] = []

    def make(min_nodes, max_nodes, node_id=None, job=None, **options):
        settings = RendezvousSettings("job", min_nodes, max_nodes, namespace=namespace, job=job,
                                      **{"lease_ttl": TTL, "last_call_timeout": 1.0, **options})
        node = NodeSpec("127.0.0.1", node_id or default_node_id())
        handler = RendezvousHandler(settings, harness.connect(), node, owns_backend=True)
        opened.append(handler)
        return handler

    make.keys = RendezvousKeys(namespace, "job")
    yield make
    for handler in opened:
        handler.shutdown()


def both_join(a, b):
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda handler: handler.next_rendezvous(), (a, b), timeout=30))


def wait_for(handler, change, timeout=10.0):
    deadline = time.monotonic() + timeout
    while handler.membership().change is not change and time.monotonic() < deadline:
        time.sleep(0.02)
    return handler.membership()


# -- item 6: the job's end ---------------------------------------------------------------------
def test_the_first_node_to_declare_records_the_end_and_a_later_declaration_changes_nothing(make_node, harness):
    a, b = make_node(1, 2, "a"), make_node(1, 2, "b")
    both_join(a, b)
    a.declare_finished()
    b.declare_finished()
    kv = harness.connect().get(make_node.keys.finished).kv
    assert decode_finished(kv.key, kv.value).node_id == "a" and kv.version == 1


def test_a_member_sees_the_end_declared_in_its_round_as_job_finished_not_a_restart(make_node):
    a, b = make_node(2, 2, "a"), make_node(2, 2, "b")
    both_join(a, b)
    a.declare_finished()
    status = wait_for(b, MembershipChange.JOB_FINISHED)
    assert status.change is MembershipChange.JOB_FINISHED
    assert status.reason == "the job finished on node a in round 0"
    assert b.is_closed() and not b.job_running()


def test_a_restarted_node_cannot_join_once_the_job_finished_and_writes_nothing(make_node, harness):
    a, b = make_node(1, 2, "a"), make_node(1, 2, "b")
    both_join(a, b)
    a.declare_finished()
    late = make_node(1, 2, "b-restarted")
    with pytest.raises(JobFinishedError, match="finished on node a in round 0") as raised:
        late.next_rendezvous()
    assert (raised.value.node_id, raised.value.round, raised.value.job_finished) == ("a", 0, True)
    assert raised.value.joined is False and "b-restarted arrived after it and joined no round" in str(raised.value)
    assert not harness.connect().get_prefix(make_node.keys.nodes_prefix(1)).kvs


def test_a_spare_that_waited_when_the_job_finished_had_joined_a_round(make_node):
    a = make_node(1, 1, "a", lease_ttl=10.0)  # a lapse of a's lease under load would give the spare its place
    a.next_rendezvous()
    spare = make_node(1, 1, "spare", lease_ttl=10.0)
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            spare.next_rendezvous()
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            raised.append(error)

    waiter = threading.Thread(target=wait)
    waiter.start()
    deadline = time.monotonic() + 10
    while spare.progress() is None and time.monotonic() < deadline:  # it joined round 1 and waits
        time.sleep(0.02)
    a.declare_finished()
    waiter.join(timeout=10)
    assert not waiter.is_alive() and len(raised) == 1 and isinstance(raised[0], JobFinishedError), raised
    assert raised[0].joined is True


def test_a_node_waiting_for_the_next_round_gives_up_when_the_job_finishes(make_node):
    a, b = make_node(2, 2, "a"), make_node(2, 2, "b")
    both_join(a, b)
    raised: list[BaseException] = []

    def rejoin() -> None:  # b's workers failed: it waits for a round of 2 that a will never join
        try:
            b.next_rendezvous()
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            raised.append(error)

    waiter = threading.Thread(target=rejoin)
    waiter.start()
    time.sleep(0.5)
    a.declare_finished()
    waiter.join(timeout=10)
    assert not waiter.is_alive() and len(raised) == 1 and isinstance(raised[0], JobFinishedError)
    assert raised[0].joined is True


def test_a_round_that_formed_without_the_finisher_sees_job_finished_elsewhere(make_node):
    a, b = make_node(1, 2, "a"), make_node(1, 2, "b")
    both_join(a, b)
    b.next_rendezvous()  # b's workers failed: it re-forms round 1 alone while a's still run in round 0
    a.declare_finished()  # a's workers finish round 0's job
    status = wait_for(b, MembershipChange.JOB_FINISHED_ELSEWHERE)
    assert status.change is MembershipChange.JOB_FINISHED_ELSEWHERE
    assert status.reason == "the job finished on node a in round 0"


@pytest.mark.parametrize("call", ["set_closed", "declare_finished"])
def test_closing_against_a_store_that_is_gone_gives_up_after_the_close_timeout(call, harness, make_node):
    if not isinstance(harness, TcpStoreHarness):
        return  # only the TCP store's server can be stopped here (as a c10d host that finished)
    a = make_node(1, 1, "a", close_timeout=1.0, join_timeout=600.0)
    a.next_rendezvous()
    harness.stop_server()
    started = time.monotonic()
    with pytest.raises(RendezvousConnectionError):
        getattr(a, call)()
    assert time.monotonic() - started < 10.0  # the close timeout, not the join timeout


# -- item 9: the job's identity ----------------------------------------------------------------
def test_nodes_whose_commands_differ_only_in_values_form_one_job(make_node, harness):
    a, b = make_node(2, 2, "a", job=TRAIN), make_node(2, 2, "b", job=TRAIN_ON_B)
    infos = both_join(a, b)
    assert sorted(info.group_rank for info in infos) == [0, 1]
    kv = harness.connect().get(make_node.keys.job).kv
    assert decode_job(kv.key, kv.value).fingerprint == TRAIN.fingerprint


def test_a_node_of_another_job_is_refused_without_writing_and_the_running_job_sees_nothing(make_node, harness):
    a, b = make_node(1, 3, "a", job=TRAIN), make_node(1, 3, "b", job=TRAIN)
    both_join(a, b)
    store = harness.connect()
    before = store.get_prefix(make_node.keys.root).revision
    intruder = make_node(1, 3, "job2", job=OTHER)
    with pytest.raises(JobMismatchError) as raised:
        intruder.next_rendezvous()
    message = str(raised.value)
    assert "\n" not in message and "train_ddp.py" in message and "probe.py" in message
    assert "hunter2" not in message and "--password REDACTED" in message
    assert store.get_prefix(make_node.keys.root).revision == before  # the join wrote nothing
    time.sleep(0.5)
    assert a.membership().change is None and b.membership().change is None


def test_an_explicit_fingerprint_lets_different_commands_form_one_job(make_node):
    a = make_node(2, 2, "a", job=job_identity("script", "train.py", [], explicit="exp-7"))
    b = make_node(2, 2, "b", job=job_identity("script", "eval.py", ["--every", "10"], explicit="exp-7"))
    assert len(both_join(a, b)) == 2
