"""Error files as torch's ``@record`` writes them, and the root-cause report built from them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from elastic.agent.processes import failures as failures_mod
from elastic.agent.processes.failures import (
    ErrorReport,
    WorkerFailure,
    dump_error_file,
    first_failure,
    parse_error_report,
    read_error_file,
    read_log_tail,
    root_cause_summary,
    signal_name,
)

RECORD_JSON = {
    "message": {
        "message": "ValueError: boom",
        "extraInfo": {
            "py_callstack": 'Traceback (most recent call last):\n  File "t.py", line 4, in main\n'
            '    raise ValueError("boom")\nValueError: boom\n',
            "timestamp": "1700000000",
        },
    }
}


def failure(local_rank=0, global_rank=0, exitcode=1, at=10.0, error=None, **kw) -> WorkerFailure:
    return WorkerFailure(
        local_rank=local_rank,
        global_rank=global_rank,
        pid=1000 + local_rank,
        exitcode=exitcode,
        exit_monotonic=at,
        exit_time=1_700_000_000.0 + at,
        error_file=f"/logs/{local_rank}/error.json",
        error=error,
        **kw,
    )


# -- parsing -----------------------------------------------------------------------------------


def test_record_format_is_parsed_into_message_traceback_and_timestamp():
    report = parse_error_report(RECORD_JSON)
    assert report == ErrorReport(
        message="ValueError: boom",
        traceback=RECORD_JSON["message"]["extraInfo"]["py_callstack"],
        timestamp=1700000000,
    )


def test_forwarded_report_keeps_its_error_code():
    data = json.loads(json.dumps(RECORD_JSON))
    data["message"]["errorCode"] = 3
    assert parse_error_report(data).error_code == 3


def test_flat_legacy_format_is_accepted():
    assert parse_error_report({"message": "RuntimeError: x", "timestamp": 5}) == ErrorReport(
        message="RuntimeError: x", timestamp=5
    )


@pytest.mark.parametrize(
    "data",
    [None, [], "text", 3, {}, {"msg": "x"}, {"message": 3}, {"message": ["a"]}],
)
def test_json_of_the_wrong_shape_is_no_report(data):
    assert parse_error_report(data) is None


def test_partial_record_shape_keeps_what_it_can():
    report = parse_error_report({"message": {"message": 7, "extraInfo": "junk"}})
    assert report == ErrorReport(message="<no message>")
    report = parse_error_report(
        {"message": {"message": "E: m", "extraInfo": {"timestamp": "soon", "py_callstack": 1}}}
    )
    assert report == ErrorReport(message="E: m")


@pytest.mark.parametrize(
    "content",
    [b"", b"   \n", b"not json", b'{"message": {"message": "trunc', b"\xff\xfe\x00", b"[1, 2]"],
)
def test_garbage_error_files_read_as_no_report(tmp_path, content):
    path = tmp_path / "error.json"
    path.write_bytes(content)
    assert read_error_file(str(path)) is None


def test_missing_or_unset_error_file_reads_as_no_report(tmp_path):
    assert read_error_file(str(tmp_path / "absent.json")) is None
    assert read_error_file("") is None
    assert read_error_file(None) is None
    assert read_error_file(str(tmp_path)) is None  # a directory


def test_oversized_error_file_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setattr(failures_mod, "MAX_ERROR_FILE_BYTES", 100)
    path = tmp_path / "error.json"
    data = json.loads(json.dumps(RECORD_JSON))
    data["message"]["extraInfo"]["py_callstack"] = "x" * 200
    path.write_text(json.dumps(data))
    assert read_error_file(str(path)) is None


@pytest.mark.slow  # a worker that imports torch (seconds)
@pytest.mark.needs_torch
def test_error_file_written_by_torch_record_is_read(tmp_path):
    """The real decorator, in a real process: the format we parse is the format it writes."""
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(
            """
            from torch.distributed.elastic.multiprocessing.errors import record

            @record
            def main():
                raise ValueError("boom from record")

            main()
            """
        )
    )
    error_file = tmp_path / "error.json"
    env = dict(os.environ, TORCHELASTIC_ERROR_FILE=str(error_file))
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, timeout=120
    )
    assert proc.returncode == 1
    raw = json.loads(error_file.read_text())
    assert set(raw) == {"message"}
    assert set(raw["message"]) == {"message", "extraInfo"}
    assert set(raw["message"]["extraInfo"]) == {"py_callstack", "timestamp"}
    report = read_error_file(str(error_file))
    assert report.message == "ValueError: boom from record"
    assert 'raise ValueError("boom from record")' in report.traceback
    assert isinstance(report.timestamp, int) and report.timestamp > 0


# -- log tails and signals ---------------------------------------------------------------------


def test_log_tail_returns_the_last_lines(tmp_path):
    path = tmp_path / "stderr.log"
    path.write_text("".join(f"line {i}\n" for i in range(100)))
    assert read_log_tail(str(path), max_lines=3) == "line 97\nline 98\nline 99"


def test_log_tail_of_a_huge_log_reads_only_its_end_and_drops_the_cut_line(tmp_path):
    path = tmp_path / "stderr.log"
    path.write_text("x" * 10_000 + "\nfirst\nlast\n")
    assert read_log_tail(str(path), max_lines=10, max_bytes=10) == "last"  # "irst" is cut
    assert read_log_tail(str(path), max_lines=10, max_bytes=11) == "first\nlast"  # whole
    assert read_log_tail(str(path), max_lines=10, max_bytes=12) == "first\nlast"


def test_log_tail_of_missing_or_empty_log_is_none(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("")
    assert read_log_tail(str(empty)) is None
    assert read_log_tail(str(tmp_path / "absent.log")) is None
    assert read_log_tail(None) is None


@pytest.mark.parametrize(
    "exitcode, name", [(-9, "SIGKILL"), (-15, "SIGTERM"), (-11, "SIGSEGV"), (0, None), (3, None)]
)
def test_signal_name_comes_from_negative_exit_codes(exitcode, name):
    assert signal_name(exitcode) == name
    assert failure(exitcode=exitcode).signal == name


def test_unknown_signal_numbers_still_get_a_name():
    assert signal_name(-200) == "SIG200"


# -- root cause --------------------------------------------------------------------------------


def test_first_failure_is_the_earliest_exit_not_caused_by_the_stop():
    early_stop_victim = failure(local_rank=0, global_rank=4, at=1.0, during_stop=True)
    cause = failure(local_rank=1, global_rank=5, at=2.0)
    later = failure(local_rank=2, global_rank=6, at=3.0)
    assert first_failure([later, early_stop_victim, cause]) is cause
    assert first_failure([early_stop_victim]) is early_stop_victim
    assert first_failure([]) is None


def test_summary_names_rank_host_exit_code_and_shows_the_traceback():
    root = failure(
        local_rank=1, global_rank=5, exitcode=1, at=1.0, error=parse_error_report(RECORD_JSON)
    )
    other = failure(local_rank=0, global_rank=4, exitcode=-15, at=2.0, during_stop=True)
    text = root_cause_summary([other, root], host="node-a", role="trainer")
    lines = text.splitlines()
    assert lines[0] == "=" * 80 and lines[-1] == "=" * 80
    assert "trainer FAILED on node-a: 2 worker(s) failed" in text
    root_part, others_part = text.split("Other failures:")
    assert "rank       : 5 (local_rank 1)" in root_part
    assert "host       : node-a" in root_part
    assert "exit       : exit code 1" in root_part
    assert "error      : ValueError: boom" in root_part
    assert '      raise ValueError("boom")' in root_part  # indented traceback
    assert "error file : /logs/1/error.json" in root_part
    assert "rank 4 (local_rank 0, pid 1000): killed by signal SIGTERM (15)" in others_part
    assert "after the agent began stopping workers" in others_part


def test_summary_of_a_killed_worker_names_the_signal_and_falls_back_to_stderr():
    root = failure(exitcode=-9, stderr_log="/logs/0/stderr.log")
    text = root_cause_summary(
        [root], host="h", role="default", stderr_tails={0: "Killed\nout of memory"}
    )
    assert "exit       : killed by signal SIGKILL (9)" in text
    assert "error file : <none written>" in text
    assert "stderr (last lines of /logs/0/stderr.log):" in text
    assert "    out of memory" in text
    assert "Other failures" not in text


def test_summary_without_error_file_or_stderr_says_how_to_get_a_traceback():
    text = root_cause_summary([failure(exitcode=2)], host="h", role="default")
    assert "errors.record" in text and "--redirects" in text


def test_summary_of_no_failures_says_so():
    assert "no worker failed" in root_cause_summary([], host="h", role="default")


# -- propagation to the agent's own error file -------------------------------------------------


def test_dump_error_file_copies_the_report_with_the_exit_code(tmp_path):
    src = tmp_path / "worker.json"
    src.write_text(json.dumps(RECORD_JSON))
    dest = tmp_path / "agent.json"
    f = WorkerFailure(
        local_rank=0, global_rank=0, pid=1, exitcode=3, exit_monotonic=0.0, exit_time=0.0,
        error_file=str(src), error=read_error_file(str(src)),
    )
    assert dump_error_file(f, str(dest)) is True
    data = json.loads(dest.read_text())
    assert data["message"]["errorCode"] == 3
    assert data["message"]["message"] == "ValueError: boom"


def test_dump_error_file_without_a_report_writes_nothing(tmp_path):
    dest = tmp_path / "agent.json"
    assert dump_error_file(failure(), str(dest)) is False
    assert not dest.exists()
