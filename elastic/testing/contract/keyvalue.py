"""The backend contract's reads and writes, conditional ones included."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from backends.api import ABSENT
from backends.errors import ValueTooLargeError
from elastic.testing.contract.fixtures import ContractFixtures


class KeyValueContract(ContractFixtures):
    """Reads, unconditional writes and conditional writes (``put_if``, ``delete_if``), racing ones
    included."""

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
