"""A module planted in the agent's working directory runs in none of the processes it starts that
are not the user's script: the lifeline watchdog, the store helper, the ``--prewarm`` templates
(finding 8 of round three) and the ``--logs-specs`` helper (issue 34, item 3). The templates
still import the user's modules from beside the script, as ``python -u script.py``.

A real ``elasticrun --standalone --prewarm --logs-specs default`` run with two gloo workers,
started from a shared working directory holding ``datetime.py``, ``json.py`` and
``selectors.py`` that record who imported them (the watchdog imports datetime through psutil,
the store helper and the templates json and selectors, the logs-specs helper json first). The
agent itself is started without its working directory on its path, as the ``elasticrun``
console script is, and the script lives elsewhere, so only a helper could import a plant.

An empty ``PYTHONPATH`` entry (``PYTHONPATH=:/x``) is the working directory to Python itself,
the agent's own interpreter included, before any line of ours runs: that one is the user's to
avoid (docs/security.md), and is not replayed here.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap

import pytest

from elastic.agent.safe_path import PACKAGE_ROOT, isolated_program
from hostile import REPO

PLANT = '''
import os, sys
with open({marker!r}, "a") as out:
    out.write(f"{{__name__}} imported by pid {{os.getpid()}}: {{sys.argv!r}}\\n")
_here = os.path.dirname(os.path.abspath(__file__))
_saved = sys.path[:]
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
del sys.modules[__name__]
try:
    import importlib
    _real = importlib.import_module(__name__)
finally:
    sys.path[:] = _saved
sys.modules[__name__] = _real
'''
"""A stand-in for a hostile module: it records the import, then hands over the real one."""

TRAIN = """
import json, os, sys
import psutil
import torch.distributed as dist
dist.init_process_group("gloo")
parent = psutil.Process(os.getppid()).cmdline()
with open(os.path.join({out!r}, "rank" + os.environ["RANK"]), "w") as f:
    json.dump({{"parent": parent, "path0": sys.path[0], "helper": sys.modules["userhelper"].__file__}}, f)
dist.destroy_process_group()
"""

HELPER = """
import os
with open({log!r}, "a") as f:
    f.write(str(os.getpid()) + "\\n")
"""


@pytest.mark.slow
def test_a_module_planted_in_the_working_directory_runs_in_no_helper(tmp_path):
    shared, code, out = tmp_path / "shared", tmp_path / "code", tmp_path / "out"
    for directory in (shared, code, out):
        directory.mkdir()
    marker = tmp_path / "planted.log"
    for name in ("datetime", "json", "selectors"):  # imported by every helper (see the docstring)
        (shared / f"{name}.py").write_text(PLANT.format(marker=str(marker)))
    (code / "train.py").write_text(textwrap.dedent(TRAIN.format(out=str(out))))
    (code / "userhelper.py").write_text(HELPER.format(log=str(tmp_path / "userhelper.log")))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    agent = "import sys; del sys.path[0]; from elastic.run import main; sys.exit(main())"
    proc = subprocess.run(
        [sys.executable, "-c", agent, "-v", "--standalone", "--prewarm", "--prewarm-modules=torch,userhelper",
         "--logs-specs=default", "--nproc-per-node=2", f"--log-dir={tmp_path / 'logs'}", str(code / "train.py")],
        cwd=shared, env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert not marker.exists(), marker.read_text()
    reports = [json.loads((out / f"rank{rank}").read_text()) for rank in (0, 1)]
    for report in reports:  # forked from a template that imported userhelper from beside the script
        assert report["path0"] == str(code)
        assert report["helper"] == str(code / "userhelper.py")
        assert "-c" in report["parent"] and any("prewarm.template" in word for word in report["parent"]), report
    assert "2 forked from pre-warmed templates" in proc.stderr  # an INFO line: -v
    # torch's DefaultLogsSpecs, built in the logs-specs helper, made its own run directory
    assert [path.name for path in (tmp_path / "logs").iterdir() if "_" in path.name], list((tmp_path / "logs").iterdir())


def test_the_isolated_prelude_drops_the_working_directory_and_keeps_pythonpath(tmp_path):
    (tmp_path / "datetime.py").write_text("raise SystemExit('planted module ran')\n")
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "onpath.py").write_text("")
    program = isolated_program("import datetime, sys, onpath, elastic\nprint(repr(sys.path))", package_root=True)
    env = {**os.environ, "PYTHONPATH": str(extra)}
    proc = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    path = eval(proc.stdout)  # noqa: S307 - our own child's repr of a list of strings
    assert "" not in path and str(tmp_path) not in path
    assert path[0] == str(extra) and PACKAGE_ROOT in path


def _isolated_names(tree: ast.Module) -> set[str]:
    """Module-level names bound to ``isolated_program(...)``."""
    return {target.id for node in tree.body if isinstance(node, ast.Assign) and _is_isolated(node.value)
            for target in node.targets if isinstance(target, ast.Name)}


def _isolated_makers(tree: ast.Module) -> set[str]:
    """Module-level functions every ``return`` of which is ``isolated_program(...)``."""
    makers = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            returns = [item for item in ast.walk(node) if isinstance(item, ast.Return)]
            if returns and all(item.value is not None and _is_isolated(item.value) for item in returns):
                makers.add(node.name)
    return makers


def _is_isolated(node: ast.AST, makers: frozenset[str] = frozenset()) -> bool:
    name = getattr(node.func, "id", None) if isinstance(node, ast.Call) else None
    return name == "isolated_program" or name in makers


def test_every_python_the_package_starts_runs_an_isolated_program():
    """Each ``subprocess`` start of ours whose command holds ``"-c"`` passes an isolated program
    next, and none runs ``python -m`` (which puts the working directory first): a new helper
    cannot forget it."""
    starts = []
    for path in [*(REPO / "elastic").rglob("*.py"), *(REPO / "backends").rglob("*.py"), *(REPO / "rpc").rglob("*.py")]:
        if "testing" in path.relative_to(REPO).parts:
            continue
        tree = ast.parse(path.read_text(), str(path))
        isolated = _isolated_names(tree)
        makers = frozenset(_isolated_makers(tree))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) in _STARTS and node.args
                    and isinstance(node.args[0], ast.List)):
                continue
            elts = node.args[0].elts
            words = [item.value if isinstance(item, ast.Constant) else None for item in elts]
            where = f"{path.relative_to(REPO)}:{node.lineno}"
            assert "-m" not in words, f"{where} starts python -m"
            if "-c" in words:
                program = elts[words.index("-c") + 1]
                assert _is_isolated(program, makers) or (isinstance(program, ast.Name) and program.id in isolated), (
                    f"{where} starts python -c without isolated_program")
                starts.append(where)
    assert len(starts) == 4, starts  # the watchdog, the store helper, the templates, the logs-specs helper


_STARTS = {"Popen", "run", "call", "check_call", "check_output"}
