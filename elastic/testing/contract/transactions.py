"""The backend contract's transactions."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from backends.api import KeyValue
from backends.errors import LeaseNotFoundError, ValueTooLargeError
from backends.txn import MAX_TXN_OPS, Compare, CompareOp, Delete, DeleteResult, Put, Range, Target, Txn, TxnResult
from elastic.testing.contract.fixtures import ContractFixtures, describe


class TransactionContract(ContractFixtures):
    """Transactions: compares as etcd judges them, one branch at one revision, nesting, refusals,
    and the rendezvous's own recipes under 16 racing clients."""

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
