"""Finding 6: files the agent writes are owner-only and never written through a symbolic link.

The event log through :class:`EventLog`; worker logs and the agent's error file through a
real ``elasticrun --standalone`` run whose worker fails.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from contextlib import contextmanager

import pytest

from elastic.agent.observe.events import Event, EventLog
from hostile import REPO


@contextmanager
def umask(mask: int):
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_symlinked_event_log_is_refused_in_one_line_and_its_target_untouched(tmp_path):
    target = tmp_path / "victim"
    target.write_text("precious\n")
    link = tmp_path / "events.jsonl"
    link.symlink_to(target)
    with pytest.raises(ValueError) as caught:
        EventLog(link, run_id="job", node="n").close()
    assert "symbolic link" in str(caught.value) and "\n" not in str(caught.value)
    assert target.read_text() == "precious\n"


def test_the_event_log_is_created_owner_only_unless_the_umask_is_stricter(tmp_path):
    for mask, expected in ((0o022, 0o600), (0o002, 0o600), (0o277, 0o400)):
        path = tmp_path / f"events-{mask:o}.jsonl"
        with umask(mask), EventLog(path, run_id="job", node="n") as log:
            log.emit(Event.NODES_WAITING, count=1)
        assert mode(path) == expected, f"umask {mask:o}"


def test_worker_logs_and_the_agent_error_file_are_owner_only(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import sys\nprint('to the log')\nsys.exit(3)\n")
    log_dir = tmp_path / "logs"
    error_file = tmp_path / "agent-error.json"
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(error_file), "PYTHONPATH": str(REPO)}
    env.pop("PET_LOG_DIR", None)
    proc = subprocess.run(
        [sys.executable, "-m", "elastic.run", "--standalone", "--nproc-per-node=1", "--redirects=3",
         f"--log-dir={log_dir}", str(script)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0
    logs = [os.path.join(root, name) for root, _, names in os.walk(log_dir) for name in names
            if name.endswith(".log")]
    assert logs, proc.stderr
    assert {path: mode(path) for path in logs} == {path: 0o600 for path in logs}
    rank_dirs = {os.path.dirname(path) for path in logs}  # where workers write their error files too
    assert {path: mode(path) for path in rank_dirs} == {path: 0o700 for path in rank_dirs}
    if error_file.exists():  # written only when the worker left a report; a plain exit leaves none
        assert mode(error_file) == 0o600


def test_the_agent_error_file_copy_is_owner_only(tmp_path):
    from elastic.agent.processes.failures import WorkerFailure, dump_error_file, read_error_file

    worker_file = tmp_path / "worker-error.json"
    worker_file.write_text(json.dumps({"message": {"message": "boom", "extraInfo": {"py_callstack": "tb"}}}))
    failure = WorkerFailure(local_rank=0, global_rank=0, pid=1, exitcode=1, exit_monotonic=0.0, exit_time=0.0,
                            error_file=str(worker_file), error=read_error_file(str(worker_file)))
    dest = tmp_path / "agent-error.json"
    with umask(0o022):
        assert dump_error_file(failure, str(dest))
    assert mode(dest) == 0o600
