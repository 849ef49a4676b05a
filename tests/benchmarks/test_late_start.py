"""benchmarks/workers/late_start.py: which benchmark workers sleep before training in the
``slow_replacement`` fault (every worker that is not its node's first)."""

from __future__ import annotations

import pytest

from bench_modules import loaded


@pytest.fixture(scope="module")
def late_start():
    with loaded("late_start", "workers/late_start.py") as module:
        yield module


START = '{"ev": "start", "t": 1.0, "pid": 7}\n'
STEP = '{"ev": "step", "step": 3, "t": 2.0}\n'


@pytest.mark.parametrize("log, environ, seconds", [
    ("", {"LIVE_RESTART_SLEEP": "10"}, 0.0),                      # the node's first worker
    (START + STEP, {"LIVE_RESTART_SLEEP": "10"}, 10.0),           # a replacement, or a restarted group
    (START + STEP, {}, 0.0),                                      # not asked for
    (START + STEP, {"LIVE_RESTART_SLEEP": ""}, 0.0),
    (START + STEP, {"LIVE_RESTART_SLEEP": "0"}, 0.0),
    (STEP + '{"ev": "sta', {"LIVE_RESTART_SLEEP": "2.5"}, 0.0),   # a half-written line is not a start
    (START + '{"ev": "sta', {"LIVE_RESTART_SLEEP": "2.5"}, 2.5),  # nor does it hide one
    ("[1, 2]\n" + STEP, {"LIVE_RESTART_SLEEP": "10"}, 0.0),       # a line that is not an event
])
def test_only_a_worker_that_is_not_its_nodes_first_sleeps(late_start, log, environ, seconds):
    assert late_start.restart_sleep(log, environ) == seconds


def test_a_negative_sleep_is_refused_in_one_line(late_start):
    with pytest.raises(ValueError, match=r"LIVE_RESTART_SLEEP \(-1\) must not be negative"):
        late_start.restart_sleep(START, {"LIVE_RESTART_SLEEP": "-1"})


def test_a_log_not_written_yet_reads_as_empty(late_start, tmp_path):
    assert late_start.read_log(str(tmp_path / "node1.jsonl")) == ""
    (tmp_path / "node1.jsonl").write_text(START)
    assert late_start.read_log(str(tmp_path / "node1.jsonl")) == START
