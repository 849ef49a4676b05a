"""The job's identity and end as pure values: fingerprints, records, guards and classifications
(issue 26 items 6 and 9). Case tables; the transactions run on the in-memory store."""

from __future__ import annotations

import pytest

from backends.api import EventType, KeyValue, WatchEvent
from backends.fake import InMemoryStore
from elastic.rendezvous.api import MembershipChange
from elastic.rendezvous.round_events import MonitorState, RoundView, classify
from elastic.rendezvous.reconcile import RoundSnapshot, reconcile
from elastic.rendezvous.errors import RendezvousStateError
from elastic.rendezvous.job import (
    COMMAND_CHARS, FinishedRecord, JobIdentity, decode_finished, decode_job, encode_finished, encode_job,
    job_identity, shown_command,
)
from elastic.rendezvous.records import Member, RendezvousKeys, RoundRecord
from elastic.rendezvous.transactions import close_txn, join_txn, read_close, read_join

KEYS = RendezvousKeys("/ns", "job")


# -- fingerprints --------------------------------------------------------------------------------
def fp(kind: str, entry: str, *args: str, explicit: str | None = None) -> str:
    return job_identity(kind, entry, args, explicit).fingerprint


@pytest.mark.parametrize("one, other, same, why", [
    (("script", "train.py", "--ckpt", "/a/x.pt"), ("script", "train.py", "--ckpt", "/b/x.pt"), True,
     "a node-local checkpoint path is legitimate"),
    (("script", "train.py", "--ckpt=/a"), ("script", "train.py", "--ckpt=/b"), True, "= form too"),
    (("script", "train.py", "--lr", "1", "--bs", "2"), ("script", "train.py", "--bs", "2", "--lr", "1"), True,
     "option order does not matter"),
    (("script", "./train.py"), ("script", "train.py"), True, "the same path"),
    (("script", "train.py", "data/a"), ("script", "train.py", "data/b"), True, "positional values may differ"),
    (("script", "train.py", "--shift", "-1"), ("script", "train.py", "--shift", "-2"), True,
     "a negative number is a value"),
    (("script", "train.py"), ("script", "probe.py"), False, "another script"),
    (("script", "train.py", "--steps", "9"), ("script", "train.py", "--epochs", "9"), False, "other options"),
    (("script", "pkg"), ("module", "pkg"), False, "a module is not a script"),
    (("module", "pkg.train"), ("module", "pkg.eval"), False, "another module"),
    (("command", "/bin/echo"), ("command", "/bin/true"), False, "another command"),
])
def test_the_fingerprint_tells_jobs_apart_but_not_per_node_values(one, other, same, why):
    assert (fp(*one) == fp(*other)) is same, why


def test_an_explicit_fingerprint_replaces_the_computed_one():
    assert fp("script", "a.py", explicit="exp") == fp("module", "b", "--x", explicit="exp")
    assert fp("script", "a.py", explicit="exp") != fp("script", "a.py")
    assert fp("script", "a.py", explicit="exp") != fp("script", "a.py", explicit="exp2")
    assert "job_fingerprint=exp" in job_identity("script", "a.py", [], "exp").command


@pytest.mark.parametrize("argv, shown", [
    (["train.py", "--steps", "10"], "train.py --steps 10"),
    (["train.py", "--password", "hunter2", "--x", "1"], "train.py --password REDACTED --x 1"),
    (["train.py", "--api-token=abc", "--key", "k"], "train.py --api-token=REDACTED --key REDACTED"),
    (["train.py", "--secret"], "train.py --secret"),  # a switch: nothing to mask
    (["train.py", "https://user:pw@host/data"], "train.py https://REDACTED@host/data"),
    (["train.py", "a b"], "train.py 'a b'"),
])
def test_a_shown_command_masks_secrets(argv, shown):
    assert shown_command(argv) == shown


def test_a_shown_command_is_cut_to_one_short_line():
    shown = shown_command(["train.py", *[f"--option-{index}" for index in range(100)]])
    assert len(shown) == COMMAND_CHARS and shown.endswith("...")


# -- records ---------------------------------------------------------------------------------------
def test_the_records_round_trip():
    finished = FinishedRecord("node-a", 3, 1700000000.5)
    assert decode_finished(KEYS.finished, encode_finished(finished)) == finished
    job = JobIdentity("0123abcd", "train.py --steps 10")
    assert decode_job(KEYS.job, encode_job(job)) == job


@pytest.mark.parametrize("key, raw", [
    (KEYS.finished, b'{"v": 2, "node": "", "round": 1, "at": 0}'),
    (KEYS.finished, b'{"v": 2, "node": "a", "round": -1, "at": 0}'),
    (KEYS.finished, b'{"v": 2, "node": "a", "round": 1, "at": "now"}'),
    (KEYS.job, b'{"v": 2, "fingerprint": 7, "command": ""}'),
    (KEYS.job, b'{"v": 1, "fingerprint": "x", "command": ""}'),
    (KEYS.job, b"not json"),
])
def test_a_corrupt_record_names_its_key(key, raw):
    decode = decode_finished if key == KEYS.finished else decode_job
    with pytest.raises(RendezvousStateError, match=key):
        decode(key, raw)


# -- the guards of the join and the close ----------------------------------------------------------
@pytest.fixture
def backend():
    store = InMemoryStore()
    client = store.client()
    yield client
    client.close()
    store.close()


def join(backend, node, expected=None, job_created=None):
    txn = join_txn(KEYS, 1, node, node.encode(), backend.grant(30).id, None, expected, job_created)
    return read_join(backend.txn(txn), KEYS.closer(1), expected is not None)


@pytest.mark.parametrize("expected", [None, 0])
def test_no_join_is_written_once_the_job_finished(backend, expected):
    backend.put(KEYS.finished, encode_finished(FinishedRecord("a", 0, 1.0)))
    outcome = join(backend, "b", expected)
    assert not outcome.joined and [kv.key for kv in outcome.state.kvs] == [KEYS.finished]
    assert backend.get(KEYS.node(1, "b")).kv is None


def test_a_join_applies_only_under_the_job_record_the_node_checked(backend):
    checked = backend.put(KEYS.job, encode_job(JobIdentity("f1", "train.py")))
    assert join(backend, "a", job_created=checked).joined
    backend.delete(KEYS.job)
    backend.put(KEYS.job, encode_job(JobIdentity("f2", "probe.py")))  # another job took the id meanwhile
    outcome = join(backend, "b", job_created=checked)
    assert not outcome.joined and backend.get(KEYS.node(1, "b")).kv is None
    assert KEYS.job in [kv.key for kv in outcome.state.kvs]


def test_no_round_closes_once_the_job_finished(backend):
    record = RoundRecord(1, (Member("b", "127.0.0.1", 1),))
    backend.put(KEYS.finished, encode_finished(FinishedRecord("a", 0, 1.0)))
    from elastic.rendezvous.records import encode_round

    result = read_close(backend.txn(close_txn(KEYS, 1, encode_round(record), 0)))
    assert not result.applied and result.current is None and result.finished.key == KEYS.finished
    assert backend.get(KEYS.round).kv is None


# -- what a member makes of the job's end ----------------------------------------------------------
OURS = RoundRecord(3, (Member("me", "h", 1), Member("a", "h", 2)))
VIEW = RoundView(KEYS, OURS, "me", 4)


def finished_event(node: str, number: int) -> WatchEvent:
    value = encode_finished(FinishedRecord(node, number, 1.0))
    return WatchEvent(EventType.PUT, KeyValue(KEYS.finished, value, 9, 9, 1, 0))


@pytest.mark.parametrize("node, number, change", [
    ("a", 3, MembershipChange.JOB_FINISHED),  # a peer of our round: let our workers finish
    ("me", 3, MembershipChange.JOB_FINISHED),
    ("x", 2, MembershipChange.JOB_FINISHED_ELSEWHERE),  # our round formed without the finisher
    ("x", 4, MembershipChange.JOB_FINISHED_ELSEWHERE),
])
def test_classify_the_jobs_end(node, number, change):
    found, state = classify(VIEW, finished_event(node, number), MonitorState())
    assert found is change and state.finished == FinishedRecord(node, number, 1.0)


@pytest.mark.parametrize("finished, closed, record, change", [
    (FinishedRecord("a", 3, 1.0), True, OURS, MembershipChange.JOB_FINISHED),  # the end outranks a close
    (FinishedRecord("x", 2, 1.0), False, RoundRecord(4, (Member("x", "h", 1),)),
     MembershipChange.JOB_FINISHED_ELSEWHERE),  # ... and a newer round
    (None, True, OURS, MembershipChange.CLOSED),
])
def test_reconcile_sees_the_jobs_end_first(finished, closed, record, change):
    snapshot = RoundSnapshot(90, record, closed, frozenset({"me", "a"}), frozenset(), frozenset(), finished)
    found = reconcile(VIEW, MonitorState(), snapshot)
    assert found.change is change
