"""Reading event logs for the timeline: what is kept, what is skipped and said, in bounded memory."""

from __future__ import annotations

import io
import json
import tracemalloc

import pytest

from elastic.agent.observe.events import Event, EventLog
from elastic.timeline.records import BadRecord, ReadLimits, Record, Skipped, UnknownEvent, parse_line, read_log

TS = "2025-01-02T03:04:05.678+00:00"
AT = 1735787045.678


def line(**fields) -> bytes:
    return json.dumps({"ts": TS, "run_id": "job", "node": "n1", "host": "box", **fields}).encode()


FINISHED = {"event": "job_finished", "status": "succeeded"}
JOINED = {"event": "round_joined", "round": 2, "group_rank": 0, "group_world_size": 2, "members": ["n1", "n2"],
          "duration_s": 0.5, "master": "h:1", "world_size": 4}


@pytest.mark.parametrize(("raw", "expected"), [
    (line(**FINISHED), Record(AT, Event.JOB_FINISHED, "n1", "box", "job", {"status": "succeeded"})),
    # Only the fields the timeline draws are kept (master is not).
    (line(**JOINED), Record(AT, Event.ROUND_JOINED, "n1", "box", "job",
                            {"round": 2, "group_rank": 0, "group_world_size": 2, "world_size": 4,
                             "duration_s": 0.5, "members": ["n1", "n2"]})),
    # A log from before node ids: no host field; the node (then the host name) stands for it.
    (json.dumps({"ts": TS, "event": "job_finished", "run_id": "job", "node": "box", "status": "ok"}).encode(),
     Record(AT, Event.JOB_FINISHED, "box", "box", "job", {"status": "ok"})),
    # A time stamp without a zone is UTC; no run id is "".
    (json.dumps({"ts": "2025-01-02T03:04:05.678", "event": "job_finished", "node": "n", "status": "ok"}).encode(),
     Record(AT, Event.JOB_FINISHED, "n", "n", "", {"status": "ok"})),
    # Long strings are cut.
    (line(event="member_lost", reason="x" * 1000), Record(AT, Event.MEMBER_LOST, "n1", "box", "job",
                                                         {"reason": "x" * 299 + "…"})),
    # Optional fields may be null where the agent writes null.
    (line(event="worker_exit", local_rank=0, global_rank=None, exitcode=None, signal="SIGKILL"),
     Record(AT, Event.WORKER_EXIT, "n1", "box", "job",
            {"local_rank": 0, "global_rank": None, "exitcode": None, "signal": "SIGKILL"})),
])
def test_a_line_becomes_a_record(raw, expected):
    assert parse_line(raw) == expected


@pytest.mark.parametrize(("raw", "why"), [
    (b"{torn", "not JSON"),
    (b"\xff\xfe binary", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b"[" * 100_000, "not JSON"),  # deeply nested: a RecursionError, caught
    (line(status="x"), "no event name"),
    (json.dumps({"ts": TS, "event": "job_finished", "status": "x"}).encode(), "no event name or node"),
    (line(event="job_finished"), "without status"),
    (line(**{**FINISHED, "ts": "yesterday"}), "bad time stamp"),
    (line(**{**FINISHED, "ts": 12}), "no time stamp"),
    (line(**{**JOINED, "round": "2"}), "bad round"),
    (line(**{**JOINED, "round": True}), "bad round"),
    (line(**{**JOINED, "duration_s": None}), "bad duration_s"),
    (line(**{**JOINED, "members": [1, 2]}), "bad members"),
    (line(event="restart", cause=None), "bad cause"),
    (line(event="node_excluded", cooldown_s=float("inf")).replace(b"Infinity", b"1e999"), "bad cooldown_s"),
    # Values no agent writes, which would overflow a date or the drawing: refused, not fatal.
    (line(**{**JOINED, "duration_s": 1e18}), "bad duration_s"),
    (line(**{**JOINED, "duration_s": 1.7e308}), "bad duration_s"),
    (line(**{**JOINED, "duration_s": -1.0}), "bad duration_s"),
    (line(event="node_excluded", cooldown_s=1e300), "bad cooldown_s"),
    (line(**{**FINISHED, "ts": "0001-01-01T00:00:00+00:00"}), "time stamp out of range"),
    (line(**{**FINISHED, "ts": "1969-12-31T23:59:59+00:00"}), "time stamp out of range"),
    (line(event="workers_started", round=1, started=[0], kept=["0"]), "bad kept"),
    (line(event="workers_started", round=1, started=[0]), "without kept"),
    (line(event="round_formed"), "without round"),
])
def test_what_is_not_an_event_record_is_refused_with_the_reason(raw, why):
    with pytest.raises(BadRecord, match=why):
        parse_line(raw)


def test_the_events_of_live_recovery_are_read():
    started = parse_line(line(event="workers_started", round=3, started=[], kept=[0, 1], refill=False))
    assert (started.event, started.fields) == (Event.WORKERS_STARTED, {"round": 3, "started": [], "kept": [0, 1],
                                                                      "refill": False})
    assert parse_line(line(event="round_formed", round=3)).fields == {"round": 3}


def test_an_event_this_version_does_not_know_is_told_apart():
    with pytest.raises(UnknownEvent) as raised:
        parse_line(line(event="checkpoint_saved"))
    assert raised.value.name == "checkpoint_saved"


def test_what_the_agent_writes_is_read_back(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventLog(path, run_id="job", node="box-1-abc", host="box") as log:
        log.emit(Event.ROUND_JOINED, **{k: v for k, v in JOINED.items() if k != "event"})
        log.emit(Event.RESTART, cause="worker_failure", restart_count=1, remaining=2)
        log.emit(Event.WORKER_EXIT, local_rank=0, global_rank=0, exitcode=None, signal="SIGKILL")
        log.emit(Event.JOB_FINISHED, status="succeeded")
    with open(path, "rb") as stream:
        records, skipped = read_log(stream, str(path))
    assert [r.event for r in records] == [Event.ROUND_JOINED, Event.RESTART, Event.WORKER_EXIT, Event.JOB_FINISHED]
    assert {(r.node, r.host, r.run_id) for r in records} == {("box-1-abc", "box", "job")}
    assert not skipped.anything


def test_bad_lines_are_skipped_and_said_in_one_line():
    data = b"\n".join([line(**FINISHED), b"{torn", b"", line(event="new_event"), line(event="other_new"),
                       line(event="new_event"), b"x" * 200, line(**FINISHED), b"\x00\x01"])
    records, skipped = read_log(io.BytesIO(data), "a.jsonl", ReadLimits(max_line_bytes=150))
    assert len(records) == 2
    assert (skipped.corrupt, skipped.unknown, skipped.too_long, skipped.first_line) == (2, 3, 1, 2)
    assert skipped.line() == ("a.jsonl: skipped 6 lines (2 not events; 3 unknown events: new_event, other_new; "
                              "1 too long), the first at line 2")
    assert "\n" not in skipped.line()


def test_names_from_the_file_reach_the_terminal_with_their_control_characters_escaped():
    hostile = "x\x1b[31mRED\x1b]0;title\x07\u2028é"
    data = b"\n".join([line(**FINISHED), line(event=hostile)])
    _, skipped = read_log(io.BytesIO(data), "a\x1b[2J.jsonl")
    said = skipped.line()
    assert said == ("a\\x1b[2J.jsonl: skipped 1 line (1 unknown event: x\\x1b[31mRED\\x1b]0;title\\x07\\u2028é), "
                    "the first at line 2")
    assert said.isprintable()


def test_records_say_the_file_they_came_from():
    records, _ = read_log(io.BytesIO(line(**FINISHED)), "node-a.jsonl")
    assert [r.source for r in records] == ["node-a.jsonl"]


def test_events_beyond_the_limit_are_counted_not_kept():
    data = b"\n".join([line(**FINISHED)] * 10)
    records, skipped = read_log(io.BytesIO(data), "a.jsonl", ReadLimits(max_events=3))
    assert len(records) == 3 and skipped.beyond_limit == 7
    assert "7 beyond the first 3 events" in skipped.line()


def test_a_line_exactly_at_the_limit_is_whole():
    raw = line(**FINISHED)
    records, skipped = read_log(io.BytesIO(raw + b"\n" + raw), "a", ReadLimits(max_line_bytes=len(raw) + 1))
    assert len(records) == 2 and skipped == Skipped("a", kept_limit=ReadLimits().max_events)


def test_a_huge_line_is_read_past_in_bounded_memory(tmp_path):
    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as out:
        out.write(line(**FINISHED) + b"\n")
        block = b"y" * (1 << 20)
        for _ in range(48):  # one 48 MiB line
            out.write(block)
        out.write(b"\n" + line(**FINISHED) + b"\n")
    tracemalloc.start()
    try:
        with open(path, "rb") as stream:
            records, skipped = read_log(stream, str(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(records) == 2 and skipped.too_long == 1 and skipped.first_line == 2
    assert peak < 4 << 20, f"peak {peak} bytes"


def test_a_stream_that_never_ends_is_read_up_to_the_byte_limit():
    with open("/dev/zero", "rb") as stream:
        records, skipped = read_log(stream, "/dev/zero", ReadLimits(max_line_bytes=4096, max_file_bytes=1 << 20))
    assert records == [] and skipped.unread_from > 1 << 20
    assert skipped.line() == f"/dev/zero: stopped reading at byte {skipped.unread_from} (the file is too large)"


@pytest.mark.parametrize("name", ["max_line_bytes", "max_events", "max_text", "max_file_bytes"])
def test_limits_must_be_positive(name):
    with pytest.raises(ValueError, match=name):
        ReadLimits(**{name: 0})
