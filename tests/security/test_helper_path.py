"""Finding 8 of round three: a module planted in the agent's working directory runs in none of
its helpers (the lifeline watchdog, the store helper, the ``--prewarm`` templates), while the
templates still import the user's modules from beside the script, as ``python -u script.py``.

A real ``elasticrun --standalone --prewarm`` run with two gloo workers, started from a shared
working directory holding a ``datetime.py`` that records who imported it (every helper imports
datetime: psutil, the store helper, torch). The agent itself is started without its working
directory on its path, as the ``elasticrun`` console script is, and the script lives elsewhere,
so only a helper could import the plant.
"""

from __future__ import annotations

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
    for name in ("datetime", "json", "selectors"):  # imported by the watchdog, the store helper, the templates
        (shared / f"{name}.py").write_text(PLANT.format(marker=str(marker)))
    (code / "train.py").write_text(textwrap.dedent(TRAIN.format(out=str(out))))
    (code / "userhelper.py").write_text(HELPER.format(log=str(tmp_path / "userhelper.log")))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    agent = "import sys; del sys.path[0]; from elastic.run import main; sys.exit(main())"
    proc = subprocess.run(
        [sys.executable, "-c", agent, "-v", "--standalone", "--prewarm", "--prewarm-modules=torch,userhelper",
         "--nproc-per-node=2", f"--log-dir={tmp_path / 'logs'}", str(code / "train.py")],
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
