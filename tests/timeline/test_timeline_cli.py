"""The timeline commands: ``python -m elastic.timeline`` and ``elasticrun timeline``, as processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.dom import parse

REPO = Path(__file__).resolve().parents[2]
TIMELINE = [sys.executable, "-m", "elastic.timeline"]
ELASTICRUN = [sys.executable, "-m", "elastic.run"]
TS = "2025-01-02T03:04:0{}.000+00:00"


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    return {**base, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), **extra}


def run(argv: list[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env(**extra), capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def write_log(path: Path, node: str, *, extra_lines: list[str] = ()) -> Path:
    records = [
        {"ts": TS.format(1), "event": "round_joined", "run_id": "job", "node": node, "host": "box", "round": 0,
         "group_rank": 0, "group_world_size": 1, "members": [node], "duration_s": 0.5},
        {"ts": TS.format(3), "event": "job_finished", "run_id": "job", "node": node, "host": "box",
         "status": "succeeded"},
    ]
    path.write_text("\n".join([json.dumps(r) for r in records] + list(extra_lines)) + "\n")
    return path


def test_logs_of_two_nodes_become_one_page_and_one_line(tmp_path):
    a, b = write_log(tmp_path / "a.jsonl", "n-a"), write_log(tmp_path / "b.jsonl", "n-b")
    result = run([*TIMELINE, str(a), str(b), "-o", "out.html"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == ["elastic-timeline: wrote out.html: 2 node(s), 1 round(s), 0 restart(s)"]
    dom = parse((tmp_path / "out.html").read_text())
    assert [lane.attrs["data-node"] for lane in dom.find_all("g", "lane")] == ["n-a", "n-b"]
    assert [p.name for p in tmp_path.iterdir() if ".tmp" in p.name] == []


def test_bad_lines_and_an_unreadable_file_are_one_line_each_and_skipped(tmp_path):
    a = write_log(tmp_path / "a.jsonl", "n-a", extra_lines=["{torn", '{"event": "from_the_future", "node": "x"}'])
    result = run([*TIMELINE, str(a), str(tmp_path / "missing.jsonl"), str(tmp_path), "-o", "-"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"elastic-timeline: {a}: skipped 2 lines (1 not events; 1 unknown event: from_the_future), the first at line 3",
        f"elastic-timeline: {tmp_path / 'missing.jsonl'}: cannot be read (No such file or directory); skipped",
        f"elastic-timeline: {tmp_path}: cannot be read (Is a directory); skipped",
    ]
    page = parse(result.stdout)  # '-': the page on standard output
    assert len(page.find_all("g", "lane")) == 1 and len(page.find_all("p", "notes")) == 3


def hostile(**fields) -> str:
    return json.dumps({"ts": TS.format(2), "event": "round_joined", "run_id": "job", "node": "n-x", "host": "box",
                       "round": 0, "group_rank": 0, "group_world_size": 1, "members": ["n-x"], "duration_s": 0.5,
                       **fields})


@pytest.mark.parametrize("lines", [
    [hostile(duration_s=1e18)],  # was an OSError out of fromtimestamp
    [hostile(ts="0001-01-01T00:00:00+00:00")],  # was a ValueError: year 0 is out of range
    [hostile(duration_s=1.7e308), hostile(node="n-y", members=["n-y"], duration_s=1.7e308)],  # an OverflowError
], ids=["duration 1e18", "year 1", "two durations of 1.7e308"])
def test_a_line_out_of_range_is_skipped_with_one_line_and_the_page_is_drawn(tmp_path, lines):
    a = write_log(tmp_path / "a.jsonl", "n-a", extra_lines=lines)
    result = run([*TIMELINE, str(a), "-o", "out.html"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"elastic-timeline: {a}: skipped {len(lines)} line{'s' if len(lines) > 1 else ''} ({len(lines)} not events), "
        "the first at line 3",
        "elastic-timeline: wrote out.html: 1 node(s), 1 round(s), 0 restart(s)"]
    assert parse((tmp_path / "out.html").read_text()).find_all("g", "lane")


def test_an_unknown_event_name_reaches_the_terminal_with_its_escape_sequences_escaped(tmp_path):
    name = "x\x1b[31mRED\x1b]0;pwned\x07"
    a = write_log(tmp_path / "a.jsonl", "n-a", extra_lines=[json.dumps({"ts": TS.format(2), "event": name,
                                                                        "node": "n-a"})])
    result = run([*TIMELINE, str(a), "-o", "out.html"], tmp_path)
    assert result.returncode == 0 and "\x1b" not in result.stderr and "\x07" not in result.stderr
    assert "1 unknown event: x\\x1b[31mRED\\x1b]0;pwned\\x07)" in result.stderr


@pytest.mark.parametrize(("argv", "code", "line"), [
    ([], 2, "elastic-timeline: error: the following arguments are required: EVENTS.jsonl (see --help)"),
    (["--frobnicate", "a"], 2, "elastic-timeline: error: unrecognized arguments: --frobnicate (see --help)"),
    (["empty.jsonl"], 1, "elastic-timeline: no events to draw in empty.jsonl"),
    (["a.jsonl", "-o", "no/such/dir/t.html"], 1, "elastic-timeline: cannot write no/such/dir/t.html: No such file or directory"),
])
def test_usage_errors_and_nothing_to_draw_are_one_line(tmp_path, argv, code, line):
    (tmp_path / "empty.jsonl").write_text("")
    write_log(tmp_path / "a.jsonl", "n-a")
    result = run([*TIMELINE, *argv], tmp_path)
    assert (result.returncode, result.stderr.splitlines()) == (code, [line])


def test_elasticrun_timeline_is_the_same_command(tmp_path):
    a = write_log(tmp_path / "a.jsonl", "n-a")
    result = run([*ELASTICRUN, "timeline", str(a), "-o", "t.html"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith("elasticrun timeline: wrote t.html")
    assert parse((tmp_path / "t.html").read_text()).find_all("g", "lane")


def test_elasticruns_help_points_to_the_timeline(tmp_path):
    result = run([*ELASTICRUN, "--help"], tmp_path)
    assert result.returncode == 0 and "elasticrun timeline EVENTS.jsonl..." in " ".join(result.stdout.split())


def test_a_training_script_named_timeline_still_runs_as_under_torchrun(tmp_path):
    (tmp_path / "timeline").write_text("import sys\nprint('the script ran with', sys.argv[1:])\n")
    result = run([*ELASTICRUN, "timeline", "a.jsonl"], tmp_path, LOGLEVEL="WARNING")
    assert result.returncode == 0, result.stderr
    assert "the script ran with ['a.jsonl']" in result.stdout
    assert "running timeline as the training command, as torchrun would" in result.stderr
    assert not (tmp_path / "timeline.html").exists()


@pytest.mark.parametrize("variable", ["PET_NO_PYTHON", "PET_MODULE"])
def test_with_no_python_or_module_set_timeline_is_the_program_or_module_torchrun_would_run(tmp_path, variable):
    (tmp_path / "bin").mkdir()
    program = tmp_path / "bin" / "timeline"
    program.write_text("#!/bin/sh\necho the program ran with \"$@\"\n")
    program.chmod(0o755)
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "timeline.py").write_text("import sys\nprint('the module ran with', sys.argv[1:])\n")
    extra = {variable: "1", "LOGLEVEL": "WARNING", "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    if variable == "PET_MODULE":
        extra["PYTHONPATH"] = os.pathsep.join([str(REPO), str(tmp_path / "mods")])
    result = run([*ELASTICRUN, "timeline", "a.jsonl"], tmp_path, **extra)
    assert result.returncode == 0, result.stderr
    ran = "the program ran with a.jsonl" if variable == "PET_NO_PYTHON" else "the module ran with ['a.jsonl']"
    assert ran in result.stdout, result.stdout


def test_the_timeline_never_imports_torch(tmp_path):
    a = write_log(tmp_path / "a.jsonl", "n-a")
    code = ("import sys\nfrom elastic.timeline.cli import main\n"
            f"assert main([{str(a)!r}, '-o', 'x.html']) == 0\n"
            "leaked = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'numpy')))\n"
            "assert not leaked, leaked\n")
    result = run([sys.executable, "-c", code], tmp_path)
    assert result.returncode == 0, result.stderr
