"""The training script is looked for before any worker starts: one line when it is not there."""

from __future__ import annotations

import io
import os

import pytest

from elastic.config import Entrypoint
from elastic.launch.cli import parse_or_exit
from elastic.launch.script_path import script_problem


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "train_ddp.py").write_text("")
    (tmp_path / "train.py").write_text("")
    return tmp_path


@pytest.mark.parametrize(("kind", "target", "expected"), [
    ("script", "train.py", None),
    ("script", "examples/train_ddp.py", None),
    ("run_path", "examples/train_ddp.py", None),
    ("script", "examples/train_dpp.py",
     "the training script examples/train_dpp.py does not exist (in {cwd}); did you mean examples/train_ddp.py?"),
    ("run_path", "tarin.py", "the training script tarin.py does not exist (in {cwd}); did you mean train.py?"),
    ("script", "examples/other.py", "the training script examples/other.py does not exist (in {cwd})"),
    ("script", "exmples/train_ddp.py",
     "the training script exmples/train_ddp.py does not exist (in {cwd}); there is no directory exmples"),
    ("script", "/no/such/dir/train.py",
     "the training script /no/such/dir/train.py does not exist; there is no directory /no/such/dir"),
    ("module", "examples.train_dpp", None),  # found on sys.path by the worker's Python, not here
    ("command", "train_dpp.sh", None),  # --no-python: found on PATH
])
def test_a_missing_script_is_named_with_the_closest_file(workdir, kind, target, expected):
    problem = script_problem(Entrypoint(kind, target), str(workdir))
    assert problem == (expected.format(cwd=workdir) if expected else None)


def test_an_absolute_path_that_exists_is_fine(workdir):
    assert script_problem(Entrypoint("script", str(workdir / "train.py")), "/") is None


def test_the_entry_point_refuses_a_missing_script_with_one_line_and_status_2(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit) as exited:
        parse_or_exit(["--standalone", "--nproc-per-node=2", "examples/train_dpp.py"], {}, stdout=out, stderr=err)
    assert exited.value.code == 2 and out.getvalue() == ""
    assert err.getvalue() == (f"elasticrun: error: the training script examples/train_dpp.py does not exist "
                              f"(in {os.getcwd()}); did you mean examples/train_ddp.py?\n")


def test_a_dry_run_does_not_look_for_the_script(workdir, monkeypatch):
    monkeypatch.chdir(workdir)  # its command line may be meant for another machine
    config = parse_or_exit(["--dry-run", "elsewhere/train.py"], {}, stderr=io.StringIO())
    assert config.dry_run and config.entrypoint.target == "elsewhere/train.py"
