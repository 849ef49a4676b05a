"""The rendezvous handler against every backend: the fake, the real TCP store and a real etcd."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from backends.api import RangeResult
from backends.counting import CountingBackend
from backends.txn import TxnResult
from elastic.rendezvous.api import MembershipChange, MembershipStatus
from elastic.rendezvous.errors import RendezvousClosedError, RendezvousStateError, RendezvousTimeoutError
from elastic.rendezvous.handler import NodeSpec, RendezvousHandler, default_node_id
from elastic.rendezvous.records import RendezvousKeys
from elastic.rendezvous.settings import RendezvousSettings

TTL = 2.0


@pytest.fixture
def make_node(harness):
    """Opens handlers on their own clients under a namespace unique to the test; shuts all down."""
    namespace = f"/rdzv-test-{uuid.uuid4().hex[:10]}"
    opened: list[RendezvousHandler] = []

    def make(min_nodes, max_nodes, node_id=None, local_world_size=1, wrap=None, **options):
        """``wrap(backend, keys)``: the backend the handler uses, around its counting client."""
        settings = RendezvousSettings("job", min_nodes, max_nodes, namespace=namespace,
                                      **{"lease_ttl": TTL, "last_call_timeout": 1.0, **options})
        backend = CountingBackend(harness.connect(), owns_inner=True)
        if wrap is not None:
            backend = wrap(backend, RendezvousKeys(namespace, "job"))
        node = NodeSpec("127.0.0.1", node_id or default_node_id(), local_world_size)
        handler = RendezvousHandler(settings, backend, node, owns_backend=True)
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


def rendezvous_all(handlers, timeout=60):
    with ThreadPoolExecutor(len(handlers)) as pool:
        return list(pool.map(lambda handler: handler.next_rendezvous(), handlers, timeout=timeout))


@pytest.mark.parametrize("nodes", [2, 16, 64])
def test_concurrent_nodes_get_unique_ranks_and_agree_on_the_round(make_node, nodes):
    handlers = [make_node(nodes, nodes) for _ in range(nodes)]
    infos = rendezvous_all(handlers)
    assert sorted(info.group_rank for info in infos) == list(range(nodes))
    assert {(info.round, info.group_world_size, info.master_addr, info.master_port) for info in infos} == {
        (infos[0].round, nodes, infos[0].master_addr, infos[0].master_port)
    }
    assert all(handler._backend.writes <= 4 for handler in handlers), [
        dict(handler._backend.counts) for handler in handlers if handler._backend.writes > 4]


def test_every_member_sees_one_world_of_the_summed_local_sizes_and_rank_0_holds_a_listening_master_port(
        make_node):
    handlers = [make_node(3, 3, node_id=f"n{index}", local_world_size=size) for index, size in enumerate((2, 1, 3))]
    infos = rendezvous_all(handlers)
    layouts = sorted((info.layout.base_rank, info.layout.local_world_size) for info in infos)
    assert [base for base, _ in layouts] == [0, layouts[0][1], layouts[0][1] + layouts[1][1]]
    assert {(info.layout.world_size, info.restart_count, info.master_port) for info in infos} == {
        (6, 0, infos[0].master_port)}
    master = next(info for info in infos if info.group_rank == 0)
    try:
        assert [info.master_listener is not None for info in infos] == [info.group_rank == 0 for info in infos]
        assert master.master_listener.getsockname()[1] == master.master_port
        socket.create_connection(("127.0.0.1", master.master_port), timeout=2).close()  # it listens already
    finally:
        master.master_listener.close()


def test_with_min_below_max_the_round_closes_when_the_last_call_passes(make_node):
    handlers = [make_node(2, 4, last_call_timeout=1.0) for _ in range(3)]
    started = time.monotonic()
    infos = rendezvous_all(handlers)
    elapsed = time.monotonic() - started
    assert [info.group_world_size for info in infos] == [3, 3, 3]
    assert 1.0 <= elapsed < 4.0


def test_at_max_nodes_the_round_closes_at_once(make_node):
    handlers = [make_node(2, 3, last_call_timeout=30.0) for _ in range(3)]
    started = time.monotonic()
    rendezvous_all(handlers)
    assert time.monotonic() - started < 5.0


def test_a_re_formed_round_closes_without_the_last_call_once_every_member_is_back(make_node):
    # A worker failure re-forms a round below the maximum: both members rejoin, and the round
    # closes at once instead of waiting the last call for nodes nobody knows of.
    handlers = [make_node(2, 3, last_call_timeout=3.0) for _ in range(2)]
    started = time.monotonic()
    first = rendezvous_all(handlers)
    assert time.monotonic() - started >= 3.0  # the first round has its last call
    started = time.monotonic()
    second = rendezvous_all(handlers)
    assert [info.round for info in second] == [first[0].round + 1] * 2
    assert time.monotonic() - started < 2.0


def test_the_survivors_close_at_once_when_a_lost_members_key_is_gone(make_node):
    handlers = [make_node(2, 3, last_call_timeout=5.0) for _ in range(3)]
    rendezvous_all(handlers)  # full: closes at once
    handlers[2].shutdown()  # leaves: its keys go now (as when its lease expires)
    started = time.monotonic()
    infos = rendezvous_all(handlers[:2])
    assert [info.group_world_size for info in infos] == [2, 2]
    assert time.monotonic() - started < 3.0


def test_without_a_spare_the_survivors_do_not_wait_for_a_live_lost_member_beyond_the_last_call(make_node):
    # A killed node's lease lives on for up to a TTL; with nobody to replace it, the survivors
    # close when the last call passes, not when its lease runs out.
    handlers = [make_node(2, 3, last_call_timeout=1.0, lease_ttl=30.0) for _ in range(3)]
    rendezvous_all(handlers)
    started = time.monotonic()
    infos = rendezvous_all(handlers[:2])  # the third never rejoins, its lease lives 30 s
    elapsed = time.monotonic() - started
    assert [info.group_world_size for info in infos] == [2, 2]
    assert 1.0 <= elapsed < 5.0


def test_with_a_rejoin_window_the_survivors_close_without_a_live_lost_member_when_it_passes(make_node):
    # --live-recovery's rejoin_timeout: members rejoin within a monitor interval, so one not back
    # within the window is left out, long before the last call or its lease.
    handlers = [make_node(1, 3, last_call_timeout=20.0, lease_ttl=30.0, rejoin_timeout=0.3) for _ in range(3)]
    full = rendezvous_all(handlers)  # full: closes at once
    started = time.monotonic()
    infos = rendezvous_all(handlers[:2])  # the third never rejoins, its lease lives 30 s
    elapsed = time.monotonic() - started
    assert [info.group_world_size for info in infos] == [2, 2] and infos[0].round == full[0].round + 1
    assert 0.3 <= elapsed < 5.0


def test_a_newcomer_alone_does_not_open_the_rejoin_window(make_node):
    # The members of a running round are not back yet (without --live-recovery they stop their
    # workers first): a newcomer's join must not close a round of one after the window.
    members = [make_node(1, 3, last_call_timeout=2.0, rejoin_timeout=0.2) for _ in range(2)]
    rendezvous_all(members)
    late = make_node(1, 3, last_call_timeout=2.0, rejoin_timeout=0.2)
    with ThreadPoolExecutor(1) as pool:
        joining = pool.submit(late.next_rendezvous)
        time.sleep(1.0)  # well past the window, within the last call
        infos = rendezvous_all(members) + [joining.result(timeout=30)]
    assert [info.group_world_size for info in infos] == [3, 3, 3]


class _JoinsUnseen:
    """A watch that never delivers join keys (``.../rounds/...``): a closer whose watch lags."""

    def __init__(self, watch):
        self._watch = watch

    def get(self, timeout=None):
        return [event for event in self._watch.get(timeout) if "/rounds/" not in event.kv.key]

    def __getattr__(self, name):
        return getattr(self._watch, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self._watch.cancel()


class _CloserThatMissesJoins:
    """A backend whose watches on the whole run (the closer's) never show joins; all else passes through."""

    def __init__(self, backend, run_root):
        self._backend = backend
        self._run_root = run_root

    def watch_prefix(self, prefix, start_revision=None):
        watch = self._backend.watch_prefix(prefix, start_revision)
        return _JoinsUnseen(watch) if prefix == self._run_root else watch

    def __getattr__(self, name):
        return getattr(self._backend, name)


def test_the_join_that_fills_the_round_closes_it_even_when_the_closer_never_sees_it(make_node):
    closer = make_node(3, 3, join_timeout=20.0, last_call_timeout=30.0,
                       wrap=lambda backend, keys: _CloserThatMissesJoins(backend, keys.root))
    with ThreadPoolExecutor(1) as pool:
        closer_info = pool.submit(closer.next_rendezvous)
        deadline = time.monotonic() + 10
        while closer.progress() is None and time.monotonic() < deadline:
            time.sleep(0.01)  # the first joiner claims the closer (it waits once it joined)
        assert closer.progress() is not None
        started = time.monotonic()
        others = rendezvous_all([make_node(3, 3, join_timeout=20.0) for _ in range(2)])
        infos = [closer_info.result(timeout=10), *others]
    assert time.monotonic() - started < 5.0  # not the closer's join timeout
    assert sorted(info.group_rank for info in infos) == [0, 1, 2]
    assert closer._backend.writes == 2  # lease and join: it never closed, and its claim went with the close
    assert closer._backend.get(closer.keys.closer(0)).kv is None


def _uncounted(result):
    """``result`` with every count-only range reading 0."""
    responses = tuple(
        _uncounted(item) if isinstance(item, TxnResult)
        else RangeResult(item.revision, (), 0) if isinstance(item, RangeResult) and not item.kvs else item
        for item in result.responses
    )
    return TxnResult(result.succeeded, result.revision, responses)


class _Uncounted:
    """A backend that does not count joiners: its node never learns that its join filled a round."""

    def __init__(self, backend):
        self._backend = backend

    def txn(self, txn):
        return _uncounted(self._backend.txn(txn))

    def __getattr__(self, name):
        return getattr(self._backend, name)


def test_when_the_join_that_filled_the_round_does_not_close_it_the_closer_does_after_a_lease_ttl(make_node):
    closer = make_node(2, 2, join_timeout=20.0)
    with ThreadPoolExecutor(1) as pool:
        closer_info = pool.submit(closer.next_rendezvous)
        deadline = time.monotonic() + 10
        while closer.progress() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        filler = make_node(2, 2, join_timeout=20.0, wrap=lambda backend, keys: _Uncounted(backend))
        started = time.monotonic()
        infos = [filler.next_rendezvous(), closer_info.result(timeout=20)]
    assert TTL - 0.1 <= time.monotonic() - started < TTL + 3.0  # the closer's grace, then its close
    assert sorted(info.group_rank for info in infos) == [0, 1]
    assert closer._backend.writes == 3 and filler._backend.writes == 2


def test_the_join_timeout_raises_on_time(make_node):
    handler = make_node(2, 2, join_timeout=1.5)
    started = time.monotonic()
    with pytest.raises(RendezvousTimeoutError, match="join timeout"):
        handler.next_rendezvous()
    assert 1.5 <= time.monotonic() - started < 1.5 + TTL + 1


def test_a_closed_rendezvous_refuses_joins(make_node):
    first = make_node(1, 1)
    first.next_rendezvous()
    first.set_closed()
    assert first.is_closed()
    with pytest.raises(RendezvousClosedError) as raised:
        make_node(1, 2).next_rendezvous()
    assert raised.value.job_finished and "the job finished" in str(raised.value)


def test_a_rendezvous_closed_for_a_failure_says_why_and_is_not_finished(make_node):
    first = make_node(1, 1)
    first.next_rendezvous()
    first.set_closed("node x gave up after 3 restarts")
    with pytest.raises(RendezvousClosedError) as raised:
        make_node(1, 2).next_rendezvous()
    assert not raised.value.job_finished and "gave up after 3 restarts" in str(raised.value)


def test_closing_the_rendezvous_is_seen_by_members(make_node):
    first, second = make_node(2, 2), make_node(2, 2)
    rendezvous_all([first, second])
    first.set_closed()
    assert wait_for_change(second, TTL + 1).change is MembershipChange.CLOSED


def test_a_late_node_is_seen_as_waiting_by_every_member_within_a_second(make_node):
    members = [make_node(2, 4, last_call_timeout=0.5) for _ in range(2)]
    rendezvous_all(members)
    late = make_node(2, 4, last_call_timeout=0.5, join_timeout=3.0)
    outcome = []
    joiner = threading.Thread(target=lambda: outcome.append(_attempt(late)), daemon=True)
    started = time.monotonic()
    joiner.start()
    for member in members:
        status = wait_for_change(member, 1.0)
        assert status.change is MembershipChange.NODES_WAITING
        assert status.waiting == 1
    assert time.monotonic() - started <= 1.0
    joiner.join(timeout=10)
    assert isinstance(outcome[0], RendezvousTimeoutError)  # members never restarted in this test


def _attempt(handler):
    try:
        return handler.next_rendezvous()
    except Exception as error:  # returned so the test thread can assert on it
        return error


def test_waiting_nodes_join_the_next_round_with_stable_ranks(make_node):
    members = [make_node(2, 4, last_call_timeout=0.5, node_id=f"m{index}") for index in range(2)]
    first = {handler.node_id: info.group_rank for handler, info in zip(members, rendezvous_all(members))}
    late = make_node(2, 4, last_call_timeout=0.5, node_id="a-late-node")
    with ThreadPoolExecutor(1) as pool:  # it joins first, the members restart when they see it
        pending = pool.submit(late.next_rendezvous)
        deadline = time.monotonic() + 10
        while members[0].membership().waiting < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        infos = rendezvous_all(members) + [pending.result(timeout=60)]
    ranks = {handler.node_id: info.group_rank for handler, info in zip(members + [late], infos)}
    assert {info.round for info in infos} == {1}
    assert ranks["a-late-node"] == 2
    assert sorted(first, key=first.get) == sorted(ranks, key=ranks.get)[:2]


def test_a_revoked_member_is_seen_as_lost_within_the_ttl(make_node, harness):
    handlers = [make_node(2, 3) for _ in range(3)]
    rendezvous_all(handlers)
    victim = handlers[-1]
    started = time.monotonic()
    victim.shutdown()
    for survivor in handlers[:-1]:
        assert wait_for_change(survivor, TTL + 1).change is MembershipChange.MEMBER_LOST
    assert time.monotonic() - started <= TTL + 1


def test_a_member_whose_lease_expires_is_seen_as_lost_within_ttl_plus_one_second(make_node):
    handlers = [make_node(2, 2) for _ in range(2)]
    rendezvous_all(handlers)
    victim = handlers[1]
    victim._membership.session._closed.set()  # the keepalive thread stops, as if the node froze
    started = time.monotonic()
    status = wait_for_change(handlers[0], TTL + 2)
    elapsed = time.monotonic() - started
    assert status.change is MembershipChange.MEMBER_LOST
    assert elapsed <= TTL + 1.0, f"lost seen after {elapsed:.2f}s"


def test_corrupt_state_in_the_store_gives_the_clear_error(make_node, harness):
    handler = make_node(1, 1)
    with harness.connect() as client:
        client.put(handler.keys.round, b"\x80\x03 not json")
    with pytest.raises(RendezvousStateError, match="state/round.*is corrupt.*--rdzv-id"):
        handler.next_rendezvous()


def test_a_node_whose_lease_expired_unnoticed_rejoins_with_a_new_lease(make_node, harness):
    # A node frozen for longer than the TTL (SIGSTOP) restarts before its keepalive thread has
    # seen the lease go: its join put fails with LeaseNotFoundError and must open a new session.
    first, second = make_node(2, 2, join_timeout=10.0), make_node(2, 2, join_timeout=10.0)
    rendezvous_all([first, second])
    with harness.connect() as client:
        client.revoke(second._membership.lease_id)
    infos = rendezvous_all([first, second])
    assert sorted(info.group_rank for info in infos) == [0, 1]
    assert {info.round for info in infos} == {1}


def test_a_joining_node_whose_lease_lapses_joins_again_and_the_round_still_closes(make_node, harness):
    # Under CPU starvation a node's keepalives can stall past the TTL while it waits for the
    # round; its key vanishes. It must notice and join again rather than wait out the join timeout.
    handlers = [make_node(3, 3, node_id=f"n{index}") for index in range(3)]
    first_two = threading.Thread(target=lambda: rendezvous_all(handlers[:2]), daemon=True)
    first_two.start()
    deadline = time.monotonic() + 10
    while handlers[0]._membership.lease_id is None and time.monotonic() < deadline:
        time.sleep(0.05)
    with harness.connect() as client:
        client.revoke(handlers[0]._membership.lease_id)  # n0, the closer, loses its lease mid-join
    late = rendezvous_all(handlers[2:])
    first_two.join(timeout=TTL + 10)
    assert not first_two.is_alive()
    assert late[0].group_world_size == 3


def test_shutdown_interrupts_a_join_in_progress(make_node):
    handler = make_node(2, 2)
    outcome = []
    joiner = threading.Thread(target=lambda: outcome.append(_attempt(handler)), daemon=True)
    joiner.start()
    time.sleep(0.5)
    started = time.monotonic()
    handler.shutdown()
    joiner.join(timeout=5)
    assert not joiner.is_alive() and time.monotonic() - started < 5
    assert isinstance(outcome[0], RendezvousClosedError)


def test_the_snapshots_answer_at_once_while_a_join_holds_the_lock(make_node):
    # membership() and progress() take no lock: a metrics thread never waits behind a join.
    handler = make_node(2, 2, join_timeout=30.0)
    with ThreadPoolExecutor(1) as pool:
        joining = pool.submit(_attempt, handler)
        deadline = time.monotonic() + 10
        while handler.progress() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        started = time.monotonic()
        status, progress = handler.membership(), handler.progress()
        assert time.monotonic() - started < 0.5
        assert status.change is None and progress is not None and progress.joined == 1
        handler.shutdown()  # and a shutdown still interrupts the join that holds the lock
        assert isinstance(joining.result(timeout=10), RendezvousClosedError)
