"""Issue 34, item 7: a file replaced whole (the timeline page, an RPC checkpoint, the agent's
error file, the PID file) is written to a new file created exclusively under a random name
beside it, never through a link another user planted at the old predictable temporary name
(``<out>.tmp<pid>`` overwrote another file with the page on main; the error file and the PID
file refused to be written at all).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from elastic.agent.private_files import replace_file


def _plant(link: Path, victim: Path) -> None:
    victim.write_text("precious\n")
    link.symlink_to(victim)


def _write_timeline(tmp_path: Path) -> tuple[Path, Path]:
    from elastic.timeline.cli import main

    log = tmp_path / "events.jsonl"
    log.write_text(json.dumps({"ts": "2025-01-02T03:04:01.000+00:00", "event": "job_finished", "run_id": "job",
                               "node": "n", "host": "box", "status": "succeeded"}) + "\n")
    out = tmp_path / "page.html"
    _plant(tmp_path / f"page.html.tmp{os.getpid()}", tmp_path / "victim")
    assert main([str(log), "-o", str(out)]) == 0
    return out, tmp_path / "victim"


def _write_checkpoint(tmp_path: Path) -> tuple[Path, Path]:
    torch = pytest.importorskip("torch")
    from rpc.checkpoint import ShardStore

    store = ShardStore(tmp_path / "ckpt", "trainer", 0)
    store.folder.mkdir(parents=True)
    _plant(store.folder / f".step-000000001.pt.tmp-{os.getpid()}", tmp_path / "victim")
    target = store.save(1, {"w": torch.ones(2)})
    assert torch.equal(store.load(1)["w"], torch.ones(2))
    return target, tmp_path / "victim"


def _write_error_file(tmp_path: Path) -> tuple[Path, Path]:
    from elastic.agent.processes.failures import WorkerFailure, dump_error_file, read_error_file

    worker_file = tmp_path / "worker-error.json"
    worker_file.write_text(json.dumps({"message": {"message": "boom", "extraInfo": {"py_callstack": "tb"}}}))
    failure = WorkerFailure(local_rank=0, global_rank=0, pid=1, exitcode=1, exit_monotonic=0.0, exit_time=0.0,
                            error_file=str(worker_file), error=read_error_file(str(worker_file)))
    dest = tmp_path / "agent-error.json"
    _plant(tmp_path / f"agent-error.json.tmp.{os.getpid()}", tmp_path / "victim")
    assert dump_error_file(failure, str(dest))
    assert json.loads(dest.read_text())["message"]["errorCode"] == 1
    return dest, tmp_path / "victim"


def _write_pid_file(tmp_path: Path) -> tuple[Path, Path]:
    from elastic.agent.lifeline import pidfile

    path = tmp_path / "agent.pid"
    _plant(tmp_path / "agent.pid.tmp", tmp_path / "victim")
    live = pidfile.PidRecord("job", pidfile.ProcessId(os.getpid(), 1.0))
    pidfile.write(str(path), live)
    assert pidfile.read(str(path)) == live
    return path, tmp_path / "victim"


@pytest.mark.parametrize("write", [_write_timeline, _write_checkpoint, _write_error_file, _write_pid_file],
                         ids=["timeline page", "rpc checkpoint", "agent error file", "pid file"])
def test_a_file_replaced_whole_is_written_past_a_link_planted_at_its_old_temporary_name(tmp_path, write):
    written, victim = write(tmp_path)
    assert victim.read_text() == "precious\n"
    assert stat.S_ISREG(os.lstat(written).st_mode)
    assert [p.name for p in written.parent.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()] == []


def test_a_replaced_file_is_whole_or_as_it_was_and_its_mode_is_as_asked(tmp_path):
    path = tmp_path / "f"
    replace_file(path, lambda out: out.write(b"one"))
    assert path.read_bytes() == b"one" and stat.S_IMODE(path.stat().st_mode) == 0o600

    def fail(out):
        out.write(b"half")
        raise RuntimeError("the writer failed")

    with pytest.raises(RuntimeError):
        replace_file(path, fail)
    assert path.read_bytes() == b"one" and sorted(p.name for p in tmp_path.iterdir()) == ["f"]
    previous = os.umask(0o027)
    try:
        replace_file(path, lambda out: out.write(b"two"), mode=0o666, durable=True)
    finally:
        os.umask(previous)
    assert path.read_bytes() == b"two" and stat.S_IMODE(path.stat().st_mode) == 0o640


def test_a_file_is_never_replaced_through_a_missing_directory_or_a_link_at_its_name(tmp_path):
    with pytest.raises(FileNotFoundError):
        replace_file(tmp_path / "missing" / "f", lambda out: out.write(b"x"))
    _plant(tmp_path / "link", tmp_path / "victim")
    replace_file(tmp_path / "link", lambda out: out.write(b"new"))  # the link itself is replaced
    assert (tmp_path / "victim").read_text() == "precious\n" and (tmp_path / "link").read_bytes() == b"new"
