"""The backend contract's watches."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from backends.errors import BackendClosedError, CompactedError
from elastic.testing.contract.fixtures import ContractFixtures, collect_events, describe


class WatchContract(ContractFixtures):
    """Watches: replay from a past revision, from now without a gap, resume, cancel, compaction,
    and surviving a server restart."""

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
