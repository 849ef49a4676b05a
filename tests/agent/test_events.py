"""The agent's JSON-lines event log."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from elastic.agent.observe.events import REQUIRED_FIELDS, Event, EventLog, RestartCause

# 2025-01-02T03:04:05.678Z
FIXED_TIME = 1735787045.678


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def make_log(path: Path | None, **kwargs) -> EventLog:
    return EventLog(path, run_id="job1", node="host-a-77-c0ffee", host="host-a", wall_clock=lambda: FIXED_TIME,
                    **kwargs)


ROUND_JOINED = dict(round=3, group_rank=0, group_world_size=2, members=["host-a-77-c0ffee", "host-b-78-bada55"],
                    duration_s=0.25)


def test_each_event_is_one_json_line_with_timestamp_run_node_id_and_host(tmp_path):
    path = tmp_path / "events.jsonl"
    with make_log(path) as log:
        log.emit(Event.ROUND_JOINED, **ROUND_JOINED)
        log.emit("job_finished", status="succeeded")

    assert read_records(path) == [
        {"ts": "2025-01-02T03:04:05.678+00:00", "event": "round_joined", "run_id": "job1",
         "node": "host-a-77-c0ffee", "host": "host-a", **ROUND_JOINED},
        {"ts": "2025-01-02T03:04:05.678+00:00", "event": "job_finished", "run_id": "job1",
         "node": "host-a-77-c0ffee", "host": "host-a", "status": "succeeded"},
    ]


def test_two_agents_on_one_host_write_their_own_node_ids_and_the_same_host(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventLog(path, run_id="job1", node="n1", host="box") as first, \
            EventLog(path, run_id="job1", node="n2", host="box") as second:
        first.emit(Event.NODES_WAITING, count=1)
        second.emit(Event.NODES_WAITING, count=1)

    assert [(r["node"], r["host"]) for r in read_records(path)] == [("n1", "box"), ("n2", "box")]


def test_the_host_defaults_to_this_machines_name(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventLog(path, run_id="job1", node="n1") as log:
        log.emit(Event.ROUND_CLOSED)

    assert read_records(path)[0]["host"] == socket.gethostname()


def test_every_event_reaches_the_file_before_emit_returns(tmp_path):
    path = tmp_path / "events.jsonl"
    log = make_log(path)
    try:
        log.emit(Event.NODES_WAITING, count=1)
        assert read_records(path)[0]["count"] == 1
    finally:
        log.close()


def test_an_existing_file_is_appended_to_not_truncated(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"event": "earlier"}\n', encoding="utf-8")
    with make_log(path) as log:
        log.emit(Event.ROUND_CLOSED)

    assert [r["event"] for r in read_records(path)] == ["earlier", "round_closed"]


def test_every_documented_event_is_accepted_with_its_required_fields(tmp_path):
    path = tmp_path / "events.jsonl"
    samples = {
        Event.ROUND_JOINED: ROUND_JOINED,
        Event.ROUND_CLOSED: {"round": 3},
        Event.MEMBER_LOST: {"reason": "lease of host-b expired"},
        Event.NODES_WAITING: {"count": 2},
        Event.RESTART: {"cause": RestartCause.MEMBERSHIP_CHANGE, "restart_count": 0,
                        "remaining": 3},
        Event.WORKER_EXIT: {"local_rank": 1, "global_rank": 3, "exitcode": None,
                            "signal": "SIGKILL"},
        Event.JOB_FINISHED: {"status": "failed"},
        Event.NODE_EXCLUDED: {"reason": "its own workers failed 2 times in a row", "cooldown_s": 600.0,
                              "failures_in_a_row": 2},
        Event.WORKERS_STARTED: {"round": 3, "started": [1], "kept": [0]},
        Event.ROUND_FORMED: {"round": 3},
    }
    assert set(samples) == set(Event)
    with make_log(path) as log:
        for event, fields in samples.items():
            assert REQUIRED_FIELDS[event] <= set(fields)
            log.emit(event, **fields)

    records = read_records(path)
    assert [r["event"] for r in records] == [e.value for e in samples]
    assert records[4]["cause"] == "membership_change"  # enums are written as their values


def test_concurrent_emits_from_threads_produce_whole_json_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    threads_n, per_thread = 8, 250
    barrier = threading.Barrier(threads_n)

    def emit_many(log: EventLog, thread_index: int) -> None:
        barrier.wait(timeout=10)
        for i in range(per_thread):
            log.emit(Event.MEMBER_LOST, reason="x" * 500, thread=thread_index, i=i)

    with make_log(path) as log:
        threads = [threading.Thread(target=emit_many, args=(log, t)) for t in range(threads_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads)

    records = read_records(path)  # json.loads fails on any torn or interleaved line
    assert len(records) == threads_n * per_thread
    assert {(r["thread"], r["i"]) for r in records} == {
        (t, i) for t in range(threads_n) for i in range(per_thread)
    }


def test_two_logs_on_one_file_do_not_interleave_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    with make_log(path) as first, make_log(path) as second:
        for i in range(100):
            first.emit(Event.NODES_WAITING, count=i)
            second.emit(Event.NODES_WAITING, count=i)

    assert len(read_records(path)) == 200


def test_a_missing_directory_fails_at_construction_naming_the_path_and_reason(tmp_path):
    path = tmp_path / "no-such-dir" / "events.jsonl"
    with pytest.raises(ValueError, match="No such file or directory") as info:
        make_log(path)
    assert str(path) in str(info.value)


def test_a_directory_as_path_fails_at_construction(tmp_path):
    with pytest.raises(ValueError, match="Is a directory") as info:
        make_log(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_a_failing_write_is_logged_once_and_does_not_stop_the_agent(caplog):
    # /dev/full opens fine and fails every write with ENOSPC.
    with make_log(Path("/dev/full")) as log, caplog.at_level(logging.WARNING):
        log.emit(Event.NODES_WAITING, count=1)
        log.emit(Event.NODES_WAITING, count=2)

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "/dev/full" in warnings[0].getMessage()


def test_no_path_writes_nothing_but_still_logs_each_event_at_debug(tmp_path, caplog, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.DEBUG, logger="elastic.agent.observe.events"):
        log = make_log(None)
        log.emit(Event.JOB_FINISHED, status="succeeded")
        log.close()

    assert list(tmp_path.iterdir()) == []
    [record] = [r for r in caplog.records if r.name == "elastic.agent.observe.events"]
    assert record.levelno == logging.DEBUG  # JSON never on the default console, nor with -v
    message = record.getMessage()
    assert "job1" in message and "host-a-77-c0ffee" in message and "job_finished" in message
    assert record.args  # lazy %-formatting, not a pre-built string


@pytest.mark.parametrize(
    ("name", "fields", "message"),
    [
        ("round_joind", {}, "Unknown event 'round_joind'"),
        (Event.ROUND_JOINED, {"round": 1}, "missing required field"),
        (Event.JOB_FINISHED, {"status": "ok", "node": "other"}, "reserved field"),
        (Event.JOB_FINISHED, {"status": "ok", "host": "other"}, "reserved field"),
        (Event.RESTART, {"cause": "oom", "restart_count": 1, "remaining": 2}, "restart cause"),
    ],
)
def test_misspelled_or_incomplete_events_are_rejected(tmp_path, name, fields, message):
    path = tmp_path / "events.jsonl"
    with make_log(path) as log, pytest.raises(ValueError, match=message):
        log.emit(name, **fields)
    assert path.read_text() == ""


def test_values_json_cannot_hold_are_written_safely(tmp_path):
    path = tmp_path / "events.jsonl"
    with make_log(path) as log:
        log.emit(Event.ROUND_JOINED, **{**ROUND_JOINED, "duration_s": float("nan"),
                                       "members": ("host-a",), "where": tmp_path})

    [record] = read_records(path)
    assert record["duration_s"] is None
    assert record["members"] == ["host-a"]
    assert record["where"] == str(tmp_path)


def test_events_after_close_are_only_logged_and_close_is_idempotent(tmp_path):
    path = tmp_path / "events.jsonl"
    log = make_log(path)
    log.close()
    log.close()
    log.emit(Event.ROUND_CLOSED)
    assert path.read_text() == ""


@pytest.mark.parametrize(("run_id", "node", "host"), [("", "n1", "host-a"), ("job1", "", "host-a"), ("job1", "n1", "")])
def test_an_empty_run_id_node_or_host_is_rejected(tmp_path, run_id, node, host):
    with pytest.raises(ValueError, match="non-empty"):
        EventLog(tmp_path / "events.jsonl", run_id=run_id, node=node, host=host)


def test_listeners_get_each_later_event_as_written(tmp_path):
    seen: list[dict] = []
    path = tmp_path / "events.jsonl"
    with make_log(path) as log:
        log.emit(Event.ROUND_CLOSED)
        log.listen(lambda record: seen.append(dict(record)))
        log.emit(Event.JOB_FINISHED, status="succeeded")

    assert seen == [read_records(path)[1]]
    assert seen[0]["event"] == "job_finished" and seen[0]["status"] == "succeeded"


CUT_SHORT = """
import os, resource, signal, sys
from elastic.agent.observe.events import Event, EventLog
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
log = EventLog(sys.argv[1], run_id="job1", node="node-a", host="host-a")
log.emit(Event.NODES_WAITING, count=1)
room = os.path.getsize(sys.argv[1]) + 20
resource.setrlimit(resource.RLIMIT_FSIZE, (room, resource.RLIM_INFINITY))  # the disk fills up
log.emit(Event.NODES_WAITING, count=2)  # cut short
log.emit(Event.NODES_WAITING, count=3)  # not written at all
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))  # space freed
log.emit(Event.NODES_WAITING, count=4)
log.close()
"""


def test_a_record_cut_short_by_a_full_disk_does_not_swallow_the_next_one(tmp_path):
    path = tmp_path / "events.jsonl"
    done = subprocess.run([sys.executable, "-c", CUT_SHORT, str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("Cannot write to the event log") == 1

    first, cut, last = path.read_text().splitlines()
    assert json.loads(first)["count"] == 1 and json.loads(last)["count"] == 4
    assert len(cut) == 20
