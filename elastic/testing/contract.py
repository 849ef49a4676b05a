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

from backends.api import ABSENT, KVBackend, WatchEvent
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

    def test_put_and_claim_always_writes_and_claims_only_when_the_claim_is_absent(self, backend, prefix):
        lease = backend.grant(30)
        first = backend.put_and_claim(prefix + "nodes/a", b"a", prefix + "claim", b"by-a", lease=lease.id)
        assert first.claimed
        assert (first.holder.key, first.holder.value, first.holder.lease) == (prefix + "claim", b"by-a", lease.id)
        assert first.holder.create_revision == first.holder.mod_revision == first.revision
        claim = backend.get(prefix + "claim").kv
        assert (claim.value, claim.create_revision, claim.lease) == (b"by-a", first.revision, lease.id)
        # Native implementations write both at one revision; the base class's fallback, one after the other.
        assert backend.get(prefix + "nodes/a").kv.mod_revision <= first.revision
        second = backend.put_and_claim(prefix + "nodes/b", b"b", prefix + "claim", b"by-b")
        assert not second.claimed and second.revision > first.revision
        assert (second.holder.value, second.holder.create_revision) == (b"by-a", first.revision)
        assert backend.get(prefix + "nodes/b").kv.value == b"b"
        backend.revoke(lease.id)  # the claim goes with its holder's lease: the next writer claims
        third = backend.put_and_claim(prefix + "nodes/c", b"c", prefix + "claim", b"by-c")
        assert third.claimed and backend.get(prefix + "claim").kv.value == b"by-c"

    def test_exactly_one_of_16_racing_put_and_claims_claims_and_all_agree_on_the_holder(self, backend, prefix):
        barrier = threading.Barrier(16)

        def join(index: int):
            barrier.wait()
            return backend.put_and_claim(prefix + f"nodes/{index}", b"x", prefix + "claim", str(index).encode())

        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(join, range(16)))
        assert sum(result.claimed for result in results) == 1
        assert len({result.holder.value for result in results}) == 1
        assert len(backend.get_prefix(prefix + "nodes/").kvs) == 16

    def test_put_and_claim_counts_the_keys_under_count_prefix_after_its_write(self, backend, prefix):
        nodes = prefix + "nodes/"
        backend.put(prefix + "nodesX", b"outside the prefix")  # a sibling that must not count
        first = backend.put_and_claim(nodes + "a", b"a", prefix + "claim", b"by-a", count_prefix=nodes)
        again = backend.put_and_claim(nodes + "a", b"a2", prefix + "claim", b"by-a")  # same key: no new one
        second = backend.put_and_claim(nodes + "b", b"b", prefix + "claim", b"by-b", count_prefix=nodes)
        assert (first.count, again.count, second.count) == (1, None, 2)
        assert first.claimed and not second.claimed  # counting changes nothing else
        guarded = backend.put_and_claim_if([(prefix + "round", ABSENT)], nodes + "c", b"c", prefix + "claim",
                                           b"by-c", read_prefix=prefix + "state/", count_prefix=nodes)
        assert guarded.applied and guarded.claim.count == 3 and not guarded.claim.claimed
        missed = backend.put_and_claim_if([(prefix + "round", 99)], nodes + "d", b"d", prefix + "claim",
                                          b"by-d", read_prefix=prefix + "state/", count_prefix=nodes)
        assert not missed.applied and missed.claim is None

    def test_every_one_of_16_racing_put_and_claims_gets_a_distinct_count_from_1_to_16(self, backend, prefix):
        barrier = threading.Barrier(16)

        def join(index: int):
            barrier.wait()
            return backend.put_and_claim(prefix + f"nodes/{index}", b"x", prefix + "claim", b"c",
                                         count_prefix=prefix + "nodes/")

        with ThreadPoolExecutor(16) as pool:
            counts = sorted(result.count for result in pool.map(join, range(16)))
        # Native implementations count at the write's revision: each sees a distinct total. The
        # base class's step-by-step default counts after its writes, so racing joins may see the
        # same later total; the last to count still sees all 16.
        assert counts[-1] == 16 and all(1 <= count <= 16 for count in counts)
        if type(backend).put_and_claim is not KVBackend.put_and_claim:
            assert counts == list(range(1, 17))

    def test_put_and_claim_on_an_unknown_lease_writes_nothing(self, backend, prefix):
        lease = backend.grant(30)
        backend.revoke(lease.id)
        with pytest.raises(LeaseNotFoundError):
            backend.put_and_claim(prefix + "k", b"v", prefix + "claim", b"c", lease=lease.id)
        assert backend.get_prefix(prefix).kvs == ()

    def test_put_and_claim_if_writes_only_when_every_guard_holds_and_always_reads(self, backend, prefix):
        state = prefix + "state/"
        lease = backend.grant(30)
        missed = backend.put_and_claim_if(
            [(state + "round", 7)], prefix + "nodes/a", b"a", state + "closer", b"by-a",
            lease=lease.id, read_prefix=state,
        )
        assert not missed.applied and missed.claim is None and missed.read.kvs == ()
        assert backend.get_prefix(prefix).kvs == ()  # a failed guard writes nothing
        joined = backend.put_and_claim_if(
            [(state + "round", ABSENT), (state + "closed", ABSENT)], prefix + "nodes/a", b"a", state + "closer",
            b"by-a", lease=lease.id, read_prefix=state,
        )
        assert joined.applied and joined.claim.claimed and joined.claim.holder.lease == lease.id
        assert backend.get(prefix + "nodes/a").kv.value == b"a"
        # The read comes after the writes: it shows the claim, at (or, for the fallback, after) their revision.
        assert [kv.key for kv in joined.read.kvs] == [state + "closer"]
        assert joined.read.revision >= joined.claim.revision
        round_revision = backend.put(state + "round", b"r1")
        second = backend.put_and_claim_if(
            [(state + "round", round_revision)], prefix + "nodes/b", b"b", state + "closer", b"by-b",
            read_prefix=state,
        )
        assert second.applied and not second.claim.claimed and second.claim.holder.value == b"by-a"
        assert [kv.key for kv in second.read.kvs] == [state + "closer", state + "round"]
        stale = backend.put_and_claim_if(
            [(state + "round", ABSENT)], prefix + "nodes/c", b"c", state + "closer", b"by-c", read_prefix=state,
        )
        assert not stale.applied and backend.get(prefix + "nodes/c").kv is None
        assert {kv.key: kv.mod_revision for kv in stale.read.kvs}[state + "round"] == round_revision

    def test_put_if_and_delete_deletes_only_when_the_put_applies_and_at_its_revision(self, backend, prefix):
        backend.put(prefix + "claim", b"mine")
        missed = backend.put_if_and_delete(prefix + "round", b"r", 12345, prefix + "claim")
        assert not missed.applied and backend.get(prefix + "claim").kv is not None
        with backend.watch_prefix(prefix) as watch:
            done = backend.put_if_and_delete(prefix + "round", b"r", ABSENT, prefix + "claim")
            events = collect_events(watch, 2, timeout=5)
        assert done.applied and done.current.value == b"r" and done.current.mod_revision == done.revision
        assert backend.get(prefix + "claim").kv is None
        assert describe(events) == [("put", prefix + "round", b"r"), ("delete", prefix + "claim", b"")]
        # Native implementations write both at one revision; the base class's fallback, one after the other.
        assert events[0].revision == done.revision and events[1].revision >= done.revision
        again = backend.put_if_and_delete(prefix + "round", b"r2", done.revision, prefix + "absent")
        assert again.applied and backend.get(prefix + "round").kv.value == b"r2"

    def test_put_and_claim_if_on_an_unknown_lease_writes_nothing(self, backend, prefix):
        lease = backend.grant(30)
        backend.revoke(lease.id)
        with pytest.raises(LeaseNotFoundError):
            backend.put_and_claim_if([(prefix + "g", ABSENT)], prefix + "k", b"v", prefix + "claim", b"c",
                                     lease=lease.id, read_prefix=prefix)
        assert backend.get_prefix(prefix).kvs == ()

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
        with backend.session(LEASE_TTL) as session:
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
