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
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from backends.api import ABSENT, KeyValue, KVBackend, WatchEvent
from backends.errors import (
    BackendAuthError,
    BackendClosedError,
    BackendConnectionError,
    BackendError,
    BackendTimeoutError,
    CompactedError,
    LeaseNotFoundError,
    ValueTooLargeError,
)
from backends.session import Session
from backends.txn import MAX_TXN_OPS, Compare, CompareOp, Delete, DeleteResult, Put, Range, Target, Txn, TxnResult
from elastic.testing.harness import BackendHarness

LEASE_TTL = 2.0
"""Lease TTL the suite uses: etcd's minimum, so every backend is held to the same promise."""


def collect_events(watch, count: int, timeout: float) -> list[WatchEvent]:
    """Read from ``watch`` until ``count`` events arrived or ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    events: list[WatchEvent] = []
    while len(events) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        events.extend(watch.get(timeout=remaining))
    return events


def describe(events: list[WatchEvent]) -> list[tuple[str, str, bytes]]:
    """Events as comparable (type, key, value) tuples."""
    return [(event.type.value, event.kv.key, event.kv.value) for event in events]


class BackendContract:
    """Tests of the key-value contract (see :mod:`backends.api`); subclass and add ``harness``."""

    @pytest.fixture
    def harness(self) -> BackendHarness:  # pragma: no cover - must be overridden
        raise NotImplementedError("A BackendContract subclass must define a `harness` fixture.")

    @pytest.fixture
    def backend(self, harness: BackendHarness):
        client = harness.connect()
        yield client
        client.close()

    @pytest.fixture
    def prefix(self, backend: KVBackend):
        name = f"/contract/{uuid.uuid4().hex[:12]}/"
        yield name
        try:
            backend.delete_prefix(name)
        except BackendError:
            pass

    # -- reads and unconditional writes ------------------------------------------------------
    def test_put_then_get_returns_value_and_revisions(self, backend, prefix):
        first = backend.put(prefix + "a", b"1")
        second = backend.put(prefix + "a", b"2")
        read = backend.get(prefix + "a")
        assert second > first
        assert read.kv is not None
        assert read.kv.value == b"2"
        assert read.kv.create_revision == first
        assert read.kv.mod_revision == second
        assert read.kv.version == 2
        assert read.kv.lease == 0
        assert read.revision >= second

    def test_get_of_a_missing_key_returns_none_with_the_store_revision(self, backend, prefix):
        revision = backend.put(prefix + "other", b"x")
        read = backend.get(prefix + "missing")
        assert read.kv is None
        assert read.revision >= revision

    def test_get_prefix_returns_only_that_prefix_in_key_order_at_one_revision(self, backend, prefix):
        for key in ("b", "a", "c/d"):
            backend.put(prefix + key, key.encode())
        last = backend.put(prefix[:-1] + "-sibling", b"not mine")
        result = backend.get_prefix(prefix)
        assert [kv.key for kv in result.kvs] == [prefix + "a", prefix + "b", prefix + "c/d"]
        assert [kv.value for kv in result.kvs] == [b"a", b"b", b"c/d"]
        assert result.revision >= last
        backend.delete(prefix[:-1] + "-sibling")

    def test_unicode_keys_and_binary_values_round_trip(self, backend, prefix):
        value = bytes(range(256))
        backend.put(prefix + "nœud-ü", value)
        assert backend.get(prefix + "nœud-ü").kv.value == value

    # -- conditional writes ------------------------------------------------------------------
    def test_create_if_absent_applies_once_and_reports_the_winner(self, backend, prefix):
        created = backend.put_if(prefix + "k", b"first", ABSENT)
        again = backend.put_if(prefix + "k", b"second", ABSENT)
        assert created.applied and created.current.value == b"first"
        assert created.current.mod_revision == created.revision
        assert not again.applied
        assert again.current.value == b"first"
        assert again.current.mod_revision == created.revision
        assert backend.get(prefix + "k").kv.value == b"first"

    def test_put_if_applies_only_on_the_expected_mod_revision(self, backend, prefix):
        revision = backend.put(prefix + "k", b"v1")
        stale = revision - 1
        updated = backend.put_if(prefix + "k", b"v2", revision)
        refused = backend.put_if(prefix + "k", b"v3", stale)
        assert updated.applied and updated.current.value == b"v2"
        assert not refused.applied
        assert refused.current.value == b"v2" and refused.current.mod_revision == updated.revision

    def test_put_if_on_a_missing_key_with_a_revision_is_refused(self, backend, prefix):
        result = backend.put_if(prefix + "missing", b"v", 5)
        assert not result.applied
        assert result.current is None
        assert backend.get(prefix + "missing").kv is None

    def test_exactly_one_of_16_racing_conditional_writes_wins(self, backend, prefix):
        key = prefix + "contended"
        start = backend.put(key, b"start")
        barrier = threading.Barrier(16)

        def contend(index: int):
            barrier.wait()
            return backend.put_if(key, f"writer-{index}".encode(), start)

        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(contend, range(16)))
        winners = [result for result in results if result.applied]
        assert len(winners) == 1
        final = backend.get(key).kv
        assert final.value == winners[0].current.value
        assert all(result.current.value == final.value for result in results if not result.applied)

    def test_exactly_one_of_16_racing_creates_wins(self, backend, prefix):
        barrier = threading.Barrier(16)

        def create(index: int):
            barrier.wait()
            return backend.put_if(prefix + "leader", str(index).encode(), ABSENT)

        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(create, range(16)))
        assert sum(result.applied for result in results) == 1

    def test_delete_and_delete_if_report_whether_they_applied(self, backend, prefix):
        revision = backend.put(prefix + "k", b"v")
        assert not backend.delete_if(prefix + "k", revision - 1).applied
        removed = backend.delete_if(prefix + "k", revision)
        assert removed.applied and removed.current is None and removed.revision > revision
        assert not backend.delete(prefix + "k").applied
        backend.put(prefix + "j", b"v")
        assert backend.delete(prefix + "j").applied
        assert backend.get(prefix + "j").kv is None

    def test_delete_prefix_deletes_every_key_under_it_and_nothing_else(self, backend, prefix):
        for key in ("x/1", "x/2", "y"):
            backend.put(prefix + key, b"v")
        assert backend.delete_prefix(prefix + "x/") == 2
        assert [kv.key for kv in backend.get_prefix(prefix).kvs] == [prefix + "y"]

    def test_values_over_the_limit_are_rejected_and_nothing_is_written(self, backend, prefix):
        too_big = b"x" * (backend.max_value_bytes + 1)
        with pytest.raises(ValueTooLargeError):
            backend.put(prefix + "big", too_big)
        with pytest.raises(ValueTooLargeError):
            backend.put_if(prefix + "big", too_big, ABSENT)
        assert backend.get(prefix + "big").kv is None
        backend.put(prefix + "ok", b"y" * 100_000)
        assert len(backend.get(prefix + "ok").kv.value) == 100_000

    # -- transactions ------------------------------------------------------------------------
    def test_a_txn_writes_its_branch_at_one_revision_and_its_reads_see_earlier_writes(self, backend, prefix):
        before = backend.put(prefix + "old", b"o")
        result = backend.txn(Txn(
            (Compare.absent(prefix + "a"),),
            (Range(prefix, prefix=True), Put(prefix + "a", b"1"), Put(prefix + "b", b"2"), Delete(prefix + "old"),
             Range(prefix, prefix=True)),
        ))
        assert result.succeeded and result.revision > before
        first, put_a, put_b, deleted, last = result.responses
        assert [kv.key for kv in first.kvs] == [prefix + "old"]
        assert [kv.key for kv in last.kvs] == [prefix + "a", prefix + "b"] and last.count == 2
        assert deleted == DeleteResult(1)
        for put, value in ((put_a, b"1"), (put_b, b"2")):
            assert (put.kv.value, put.kv.create_revision, put.kv.mod_revision, put.kv.version) == (
                value, result.revision, result.revision, 1)
        assert {kv.key: kv.mod_revision for kv in backend.get_prefix(prefix).kvs} == {
            prefix + "a": result.revision, prefix + "b": result.revision}

    def test_a_txn_put_reports_the_key_as_written(self, backend, prefix):
        created = backend.put(prefix + "k", b"1")
        backend.put(prefix + "k", b"2")
        lease = backend.grant(30)
        result = backend.txn(Txn((), (Put(prefix + "k", b"3", lease.id),)))
        written = result.responses[0].kv
        assert written == KeyValue(prefix + "k", b"3", created, result.revision, 3, lease.id)
        assert backend.get(prefix + "k").kv == written
        backend.revoke(lease.id)

    def test_a_txn_that_names_a_dead_lease_on_its_path_writes_nothing(self, backend, prefix):
        lease = backend.grant(30)
        backend.revoke(lease.id)
        before = backend.put(prefix + "mark", b"m")
        with pytest.raises(LeaseNotFoundError):
            backend.txn(Txn((), (Put(prefix + "a", b"1"), Txn((), (Put(prefix + "b", b"2", lease.id),)))))
        assert [kv.key for kv in backend.get_prefix(prefix).kvs] == [prefix + "mark"]
        assert backend.get(prefix + "mark").revision == before
        # The lease is checked only on the path taken: a dead lease in the other branch is no error.
        result = backend.txn(Txn((Compare.absent(prefix + "a"),), (Put(prefix + "a", b"1"),),
                                 (Put(prefix + "b", b"2", lease.id),)))
        assert result.succeeded and backend.get(prefix + "a").kv.value == b"1"

    def test_watchers_see_every_write_of_a_txn_at_its_revision_in_one_batch(self, backend, prefix):
        backend.put(prefix + "gone", b"x")
        with backend.watch_prefix(prefix) as watch:
            result = backend.txn(Txn((), (Put(prefix + "a", b"1"), Delete(prefix + "gone"), Put(prefix + "b", b"2"))))
            batch = watch.get(timeout=5)
            rest = watch.get(timeout=0.3)
        assert describe(batch) == [("put", prefix + "a", b"1"), ("delete", prefix + "gone", b""),
                                   ("put", prefix + "b", b"2")]
        assert {event.revision for event in batch} == {result.revision} and rest == []

    def test_every_compare_target_and_operator_as_etcd_judges_them_absent_keys_included(self, backend, prefix):
        key, absent = prefix + "k", prefix + "absent"
        created = backend.put(key, b"v1")
        modified = backend.put(key, b"v2")
        eq, ne, lt, gt = CompareOp.EQUAL, CompareOp.NOT_EQUAL, CompareOp.LESS, CompareOp.GREATER
        create, mod, version, value = Target.CREATE_REVISION, Target.MOD_REVISION, Target.VERSION, Target.VALUE
        table = [  # (key, target, operator, operand, holds)
            (key, create, eq, created, True), (key, create, ne, created, False), (key, create, lt, created + 1, True),
            (key, create, lt, created, False), (key, create, gt, created - 1, True), (key, create, gt, created, False),
            (key, mod, eq, modified, True), (key, mod, eq, created, False), (key, mod, ne, created, True),
            (key, mod, lt, modified, False), (key, mod, gt, created, True),
            (key, version, eq, 2, True), (key, version, ne, 2, False), (key, version, lt, 3, True),
            (key, version, lt, 2, False), (key, version, gt, 1, True), (key, version, gt, 2, False),
            (key, value, eq, b"v2", True), (key, value, eq, b"v1", False), (key, value, ne, b"v1", True),
            (key, value, ne, b"v2", False), (key, value, lt, b"v3", True), (key, value, lt, b"v2", False),
            (key, value, gt, b"v1", True), (key, value, gt, b"v2", False), (key, value, eq, b"", False),
            (absent, create, eq, 0, True), (absent, create, gt, 0, False), (absent, create, ne, 0, False),
            (absent, mod, eq, 0, True), (absent, mod, lt, 1, True), (absent, version, eq, 0, True),
            (absent, version, gt, 0, False),
            (absent, value, eq, b"", False), (absent, value, ne, b"x", False), (absent, value, lt, b"z", False),
            (absent, value, gt, b"", False),
        ]
        wrong = []
        for case in table:
            result = backend.txn(Txn((Compare(*case[:4]),), (Range(key, count_only=True),), (Range(absent),)))
            taken = result.responses[0].count == 1
            if (result.succeeded, taken) != (case[4], case[4]):
                wrong.append(case)
        assert wrong == []
        both = backend.txn(Txn((Compare.exists(key), Compare.absent(absent)), (Range(key),)))
        one = backend.txn(Txn((Compare.exists(key), Compare.exists(absent)), (Range(key),)))
        assert both.succeeded and not one.succeeded and one.responses == ()
        assert backend.get(key).kv.mod_revision == modified  # reads only: nothing written

    def test_the_failure_branch_runs_its_reads_and_writes_nothing_else(self, backend, prefix):
        written = backend.put(prefix + "k", b"v")
        backend.put(prefix + "n/1", b"a")
        result = backend.txn(Txn(
            (Compare.mod_revision(prefix + "k", written - 1),),
            (Put(prefix + "k", b"mine"),),
            (Range(prefix + "k"), Range(prefix + "n/", prefix=True)),
        ))
        assert not result.succeeded and result.revision >= written
        current, listed = result.responses
        assert [(kv.key, kv.value, kv.mod_revision) for kv in current.kvs] == [(prefix + "k", b"v", written)]
        assert [kv.value for kv in listed.kvs] == [b"a"] and listed.count == 1
        assert backend.get(prefix + "k").kv.value == b"v"

    def test_a_nested_txn_is_judged_on_the_state_before_any_write(self, backend, prefix):
        result = backend.txn(Txn((), (
            Put(prefix + "a", b"1"),
            Txn((Compare.absent(prefix + "a"),), (Put(prefix + "seen-absent", b"y"),),
                (Put(prefix + "seen-present", b"y"),)),
        )))
        nested = result.responses[1]
        assert isinstance(nested, TxnResult) and nested.succeeded
        assert nested.responses[0].kv.key == prefix + "seen-absent"
        assert [kv.key for kv in backend.get_prefix(prefix).kvs] == [prefix + "a", prefix + "seen-absent"]
        assert {kv.mod_revision for kv in backend.get_prefix(prefix).kvs} == {result.revision}

    def test_count_only_ranges_count_without_values(self, backend, prefix):
        for name in ("n/1", "n/2", "n/3", "nX"):
            backend.put(prefix + name, b"v")
        result = backend.txn(Txn((), (
            Range(prefix + "n/", prefix=True, count_only=True), Range(prefix + "n/1", count_only=True),
            Range(prefix + "n/9", count_only=True), Range(prefix + "n/", prefix=True),
        )))
        counted, one, none, listed = result.responses
        assert (counted.count, counted.kvs, one.count, one.kvs, none.count) == (3, (), 1, (), 0)
        assert listed.count == len(listed.kvs) == 3

    def test_a_txn_delete_with_prefix_deletes_everything_under_it_and_a_missing_key_changes_nothing(
        self, backend, prefix,
    ):
        for name in ("x/1", "x/2", "x", "y"):
            backend.put(prefix + name, b"v")
        result = backend.txn(Txn((), (Delete(prefix + "x/", prefix=True),)))
        assert result.responses == (DeleteResult(2),)
        assert [kv.key for kv in backend.get_prefix(prefix).kvs] == [prefix + "x", prefix + "y"]
        nothing = backend.txn(Txn((), (Delete(prefix + "missing"),)))
        assert nothing.responses == (DeleteResult(0),) and nothing.revision == result.revision

    def test_a_txn_that_may_write_a_key_twice_or_too_much_is_refused_before_anything_is_written(
        self, backend, prefix,
    ):
        k = prefix + "k"
        refused = [
            Txn((), (Put(k, b"1"), Put(k, b"2"))),
            Txn((), (Put(k, b"1"), Delete(prefix, prefix=True))),
            Txn((), (Put(k, b"1"), Txn((), (), (Put(k, b"2"),)))),
            Txn((), (Txn((), (Put(k, b"1"),)), Txn((), (), (Put(k, b"2"),)))),
            Txn((), tuple(Range(k) for _ in range(MAX_TXN_OPS + 1))),
            Txn((), (Put(k, b"x" * (backend.max_value_bytes + 1)),)),
        ]
        for txn in refused:
            with pytest.raises((ValueError, ValueTooLargeError)):
                backend.txn(txn)
        assert backend.get_prefix(prefix).kvs == ()
        # The two branches of one nested txn exclude each other: both may put the key.
        allowed = backend.txn(Txn((), (Txn((Compare.absent(k),), (Put(k, b"new"),), (Put(k, b"again"),)),)))
        assert allowed.responses[0].succeeded and backend.get(k).kv.value == b"new"

    def test_an_empty_txn_succeeds_at_the_store_revision(self, backend, prefix):
        revision = backend.put(prefix + "k", b"v")
        result = backend.txn(Txn())
        assert result.succeeded and result.responses == () and result.revision >= revision

    def test_exactly_one_of_16_racing_create_if_absent_txns_wins_and_15_losers_read_the_winner(self, backend, prefix):
        key = prefix + "leader"
        barrier = threading.Barrier(16)

        def create(index: int) -> TxnResult:
            barrier.wait()
            return backend.txn(Txn((Compare.absent(key),), (Put(key, str(index).encode()),), (Range(key),)))

        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(create, range(16)))
        winners = [result for result in results if result.succeeded]
        assert len(winners) == 1
        winner = winners[0].responses[0].kv
        assert backend.get(key).kv == winner
        losers = [result.responses[0].kvs for result in results if not result.succeeded]
        assert losers == [(winner,)] * 15

    def test_16_racing_joiners_with_the_rendezvous_join_recipe_get_counts_1_to_16_and_one_closer(
        self, backend, prefix,
    ):
        """The rendezvous join: if the round is still R and not closed, put my join key, create the
        closer claim if absent (else read it) and count the round's nodes; read the state either way."""
        state, nodes = prefix + "state/", prefix + "round/nodes/"
        lease = backend.grant(30)
        round_revision = backend.put(state + "round", b"r1")

        def join_txn(index: int, expected: int) -> Txn:
            claim = state + "closer"
            return Txn(
                (Compare.mod_revision(state + "round", expected), Compare.absent(state + "closed")),
                (Put(nodes + f"{index:02d}", b"n", lease.id),
                 Txn((Compare.absent(claim),), (Put(claim, str(index).encode(), lease.id),), (Range(claim),)),
                 Range(nodes, prefix=True, count_only=True),
                 Range(state, prefix=True)),
                (Range(state, prefix=True),),
            )

        barrier = threading.Barrier(16)

        def join(index: int) -> TxnResult:
            barrier.wait()
            return backend.txn(join_txn(index, round_revision))

        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(join, range(16)))
        assert all(result.succeeded for result in results)
        assert sorted(result.responses[2].count for result in results) == list(range(1, 17))
        claims = [result.responses[1] for result in results]
        assert sum(claim.succeeded for claim in claims) == 1
        holder = backend.get(state + "closer").kv
        assert {claim.responses[0].kv if claim.succeeded else claim.responses[0].kvs[0] for claim in claims} == {holder}
        for result in results:  # the state read after the writes shows the claim, at the txn's revision
            assert [kv.key for kv in result.responses[3].kvs] == [state + "closer", state + "round"]
        stale = backend.txn(join_txn(16, round_revision - 1))
        backend.put(state + "closed", b"c")
        closed = backend.txn(join_txn(17, round_revision))
        for missed in (stale, closed):
            assert not missed.succeeded and missed.responses[0].kvs[-1].key == state + "round"
        assert len(backend.get_prefix(nodes).kvs) == 16
        backend.revoke(lease.id)

    # -- leases ------------------------------------------------------------------------------
    def test_lease_expiry_removes_keys_and_delivers_delete_within_ttl_plus_one_second(self, backend, prefix):
        lease = backend.grant(LEASE_TTL)
        granted_at = time.monotonic()
        put_revision = backend.put(prefix + "ephemeral", b"v", lease=lease.id)
        assert backend.get(prefix + "ephemeral").kv.lease == lease.id
        with backend.watch_prefix(prefix, start_revision=put_revision + 1) as watch:
            events = collect_events(watch, 1, timeout=LEASE_TTL + 3)
        seen_after = time.monotonic() - granted_at
        assert describe(events) == [("delete", prefix + "ephemeral", b"")]
        assert seen_after <= lease.ttl + 1.0, f"DELETE seen {seen_after:.2f}s after grant"
        assert backend.get(prefix + "ephemeral").kv is None
        with pytest.raises(LeaseNotFoundError):
            backend.keepalive(lease.id)

    def test_keepalive_keeps_keys_alive_past_several_ttls(self, backend, prefix):
        lease = backend.grant(LEASE_TTL)
        backend.put(prefix + "kept", b"v", lease=lease.id)
        deadline = time.monotonic() + 3 * lease.ttl
        while time.monotonic() < deadline:
            assert backend.keepalive(lease.id) > 0
            time.sleep(lease.ttl / 4)
        assert backend.get(prefix + "kept").kv is not None
        assert backend.revoke(lease.id)

    def test_revoke_deletes_the_leases_keys_at_once(self, backend, prefix):
        lease = backend.grant(30)
        backend.put(prefix + "a", b"v", lease=lease.id)
        backend.put_if(prefix + "b", b"v", ABSENT, lease=lease.id)
        assert backend.revoke(lease.id) is True
        assert backend.get_prefix(prefix).kvs == ()
        assert backend.revoke(lease.id) is False
        with pytest.raises(LeaseNotFoundError):
            backend.keepalive(lease.id)

    def test_a_write_bound_to_an_unknown_lease_is_refused(self, backend, prefix):
        lease = backend.grant(30)
        backend.revoke(lease.id)
        with pytest.raises(LeaseNotFoundError):
            backend.put(prefix + "k", b"v", lease=lease.id)
        assert backend.get(prefix + "k").kv is None

    def test_a_session_keeps_its_lease_alive_and_reports_loss_when_revoked(self, backend, prefix):
        with Session(backend, LEASE_TTL) as session:
            backend.put(prefix + "member", b"v", lease=session.lease_id)
            time.sleep(2 * session.ttl)
            assert backend.get(prefix + "member").kv is not None
            assert session.alive
            lost = []
            session.on_lost(lost.append)
            backend.revoke(session.lease_id)
            assert session.wait_lost(timeout=session.ttl + 1)
            assert lost and not session.alive

    # -- watches -----------------------------------------------------------------------------
    def test_watch_from_a_past_revision_replays_events_in_order_then_goes_live(self, backend, prefix):
        first = backend.put(prefix + "a", b"1")
        backend.put(prefix + "b", b"2")
        backend.put(prefix + "a", b"3")
        backend.delete(prefix + "b")
        with backend.watch_prefix(prefix, start_revision=first) as watch:
            replayed = collect_events(watch, 4, timeout=5)
            backend.put(prefix + "c", b"4")
            live = collect_events(watch, 1, timeout=5)
        assert describe(replayed) == [
            ("put", prefix + "a", b"1"),
            ("put", prefix + "b", b"2"),
            ("put", prefix + "a", b"3"),
            ("delete", prefix + "b", b""),
        ]
        revisions = [event.revision for event in replayed + live]
        assert revisions == sorted(revisions) and revisions[0] == first
        assert describe(live) == [("put", prefix + "c", b"4")]
        assert watch.last_revision == live[-1].revision

    def test_watch_from_now_sees_only_later_changes_under_its_prefix(self, backend, prefix):
        backend.put(prefix + "before", b"old")
        with backend.watch_prefix(prefix + "w/") as watch:
            backend.put(prefix + "outside", b"no")
            backend.put(prefix + "w/inside", b"yes")
            events = collect_events(watch, 1, timeout=5)
            assert watch.get(timeout=0.3) == []
        assert describe(events) == [("put", prefix + "w/inside", b"yes")]
        assert events[0].kv.create_revision == events[0].revision

    def test_a_watch_from_now_knows_its_start_and_a_read_after_it_leaves_no_gap(self, backend, prefix):
        before = backend.put(prefix + "k", b"old")
        with backend.watch_prefix(prefix) as watch:
            assert watch.last_revision >= before  # everything above it is reported
            read = backend.get_prefix(prefix)
            assert read.revision >= watch.last_revision
            later = backend.put(prefix + "k", b"new")
            events = collect_events(watch, 1, timeout=5)
        assert [(event.revision, event.kv.value) for event in events] == [(later, b"new")]

    def test_racing_writers_miss_nothing_between_a_watch_from_now_and_a_read(self, backend, prefix):
        """Watch from now, then read: every change is either in the read or reported after it."""
        stop = threading.Event()
        written: list[int] = []

        def write() -> None:
            for index in range(10_000):
                if stop.is_set():
                    return
                written.append(backend.put(prefix + f"k{index % 7}", str(index).encode()))

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        try:
            time.sleep(0.05)
            with backend.watch_prefix(prefix) as watch:
                read = backend.get_prefix(prefix)
                time.sleep(0.05)
                stop.set()
                writer.join(timeout=10)
                newest = max(written)
                seen = {kv.key: kv.mod_revision for kv in read.kvs}
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline and (not seen or max(seen.values()) < newest):
                    for event in watch.get(timeout=0.5):
                        if event.revision > read.revision:
                            seen[event.kv.key] = event.revision
        finally:
            stop.set()
            writer.join(timeout=10)
        assert max(seen.values()) == newest
        assert seen == {kv.key: kv.mod_revision for kv in backend.get_prefix(prefix).kvs}

    def test_a_watch_resumed_from_its_last_revision_loses_and_repeats_nothing(self, backend, prefix):
        with backend.watch_prefix(prefix) as watch:
            backend.put(prefix + "1", b"a")
            seen = collect_events(watch, 1, timeout=5)
        backend.put(prefix + "2", b"b")
        backend.put(prefix + "3", b"c")
        with backend.watch_prefix(prefix, start_revision=watch.last_revision + 1) as resumed:
            rest = collect_events(resumed, 2, timeout=5)
        assert [event.kv.key for event in seen + rest] == [prefix + "1", prefix + "2", prefix + "3"]

    def test_a_cancelled_watch_raises_closed(self, backend, prefix):
        watch = backend.watch_prefix(prefix)
        watch.cancel()
        watch.cancel()
        with pytest.raises(BackendClosedError):
            watch.get(timeout=1)

    def test_watching_compacted_history_raises_compacted(self, backend, prefix):
        first = backend.put(prefix + "k", b"1")
        backend.put(prefix + "k", b"2")
        last = backend.put(prefix + "k", b"3")
        backend.compact(last)
        with pytest.raises(CompactedError) as raised:
            with backend.watch_prefix(prefix, start_revision=first) as watch:
                collect_events(watch, 1, timeout=5)
        assert raised.value.requested_revision == first
        assert raised.value.compact_revision >= first + 1

    def test_a_watch_outlives_a_server_restart_and_resumes_from_its_last_revision(self, harness):
        # The backend resumes its watches (one layer does; consumers never re-open a watch for
        # an outage): down for longer than a request timeout, the watch raises nothing, and
        # once the server is back it delivers what follows, once, from where it left off. A
        # server that came back without its history says so with CompactedError.
        client = harness.connect(request_timeout=1.0)
        prefix = f"/contract/{uuid.uuid4().hex[:12]}/"
        watch = client.watch_prefix(prefix)
        try:
            first = client.put(prefix + "1", b"a")
            assert [event.revision for event in collect_events(watch, 1, timeout=5)] == [first]
            harness.stop_server()
            try:
                assert watch.get(timeout=2.5) == []
            finally:
                harness.start_server()
            if not harness.restart_keeps_history:
                with pytest.raises(CompactedError):
                    collect_events(watch, 1, timeout=15)
                return
            with harness.connect() as writer:
                second = writer.put(prefix + "2", b"b")
            assert [(event.kv.key, event.revision) for event in collect_events(watch, 1, timeout=15)] == [
                (prefix + "2", second)]
            assert watch.get(timeout=0.3) == []
        finally:
            watch.cancel()
            client.close()

    # -- failures ----------------------------------------------------------------------------
    def test_wrong_credentials_give_an_auth_error(self, harness):
        with pytest.raises(BackendAuthError):
            client = harness.connect_with_wrong_credentials()
            try:
                client.get("/contract/auth-probe")
            finally:
                client.close()

    def test_a_closed_client_refuses_calls(self, harness):
        client = harness.connect()
        client.close()
        client.close()
        with pytest.raises(BackendClosedError):
            client.get("/contract/closed-probe")

    def test_a_server_stopped_under_a_client_gives_a_connection_error_within_its_timeout(self, harness):
        request_timeout = 2.0
        client = harness.connect(request_timeout=request_timeout)
        try:
            key = f"/contract/{uuid.uuid4().hex[:12]}/k"
            client.put(key, b"v")
            watch = client.watch_prefix(key)
            harness.stop_server()
            try:
                started = time.monotonic()
                with pytest.raises((BackendConnectionError, BackendTimeoutError)):
                    client.get(key)
                elapsed = time.monotonic() - started
                assert elapsed <= request_timeout + 1.0, f"took {elapsed:.2f}s"
            finally:
                harness.start_server()
            watch.cancel()
        finally:
            client.close()
        with harness.connect() as fresh:
            assert fresh.put(key, b"again") > 0
