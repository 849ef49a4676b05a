"""``--logs-specs NAME`` on the command line, and end to end beside stock torchrun.

A name torchrun would not find in its ``torchrun.logs_specs`` entry-point group is refused at
once with one line, without importing torch; a name it finds is honoured: the plugin (here
``support.flat_logs``, a distribution installed into a temporary directory on
``PYTHONPATH``) decides where each rank's files go, under elasticrun as under torchrun.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from elastic.launch.cli import ConfigError, config_from_args, installed_logs_specs

from support.flat_logs import ENTRY_POINT, install_flat_logs

LAUNCHERS = {
    "elasticrun": [sys.executable, "-m", "elastic.run"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
}
WORKER = """
import os, sys
open(os.path.join(os.environ["MARKS"], "started-" + os.environ["RANK"]), "w").close()
print("out", os.environ["RANK"], os.environ.get("FLAT_LOGS"), flush=True)
print("err", os.environ["RANK"], file=sys.stderr, flush=True)
"""


def parse(*argv: str, names=("default", "flat")):
    return config_from_args(list(argv), {}, warn=lambda _: None, logs_specs_names=lambda: list(names))


def test_a_known_name_is_kept_and_the_group_is_asked_only_when_the_flag_is_given():
    assert parse("--logs-specs", "flat", "t.py").logs_specs == "flat"
    assert parse("--logs_specs=default", "t.py").logs_specs == "default"

    def never() -> list[str]:
        raise AssertionError("the entry points were read without --logs-specs")

    assert config_from_args(["t.py"], {}, warn=lambda _: None, logs_specs_names=never).logs_specs is None


def test_an_unknown_name_is_one_line_naming_the_installed_ones():
    with pytest.raises(ConfigError) as raised:
        parse("--logs-specs", "flatt", "t.py")
    assert str(raised.value) == ("--logs-specs: no entry point 'flatt' in the torchrun.logs_specs group (installed: "
                                 "default, flat); install the package that provides it")


def test_the_installed_names_are_read_from_metadata_without_importing_torch():
    code = ("import sys; from elastic.launch.cli import installed_logs_specs; names = installed_logs_specs(); "
            "assert 'torch' not in sys.modules; print(','.join(names))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "default" in result.stdout.strip().split(",")  # torch registers its DefaultLogsSpecs
    assert "default" in installed_logs_specs()


# -- end to end, beside torchrun ---------------------------------------------------------------


@pytest.fixture
def plugin_env(tmp_path) -> dict[str, str]:
    site = install_flat_logs(tmp_path / "site")
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PET_", "TORCHELASTIC_", "OMP_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def launch(launcher: str, tmp_path: Path, env: dict[str, str], *flags: str) -> tuple[subprocess.CompletedProcess, Path]:
    """Run two workers of WORKER under ``launcher``; returns the result and the directory of
    the marks each started worker leaves."""
    marks = tmp_path / f"marks-{launcher}"
    marks.mkdir()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    argv = [*LAUNCHERS[launcher], "--nproc-per-node=2", *flags, str(script)]
    result = subprocess.run(argv, capture_output=True, text=True, env=dict(env, MARKS=str(marks)), timeout=120,
                            check=False)
    return result, marks


@pytest.mark.slow
def test_the_plugin_places_each_ranks_files_under_elasticrun_as_under_torchrun(tmp_path, plugin_env):
    files, consoles = {}, {}
    for launcher in LAUNCHERS:
        run_id = f"{launcher}-{uuid.uuid4().hex[:6]}"
        result, _ = launch(launcher, tmp_path, plugin_env, f"--logs-specs={ENTRY_POINT}", "--rdzv-backend=c10d",
                           "--rdzv-endpoint=localhost:0", f"--rdzv-id={run_id}", f"--log-dir={tmp_path / launcher}",
                           "--redirects=3", "--tee=0:1")
        assert result.returncode == 0, result.stderr
        flat = tmp_path / launcher / "flat"
        files[launcher] = {path.name.replace(run_id, "RUN"): path.read_text() for path in flat.iterdir()}
        consoles[launcher] = [line for line in result.stdout.splitlines() if "out " in line]
    assert files["elasticrun"] == files["torchrun"] == {
        "RUN-r0-0.out": "out 0 0\n", "RUN-r0-0.err": "err 0\n", "RUN-r0-1.out": "out 1 1\n", "RUN-r0-1.err": "err 1\n",
    }
    assert consoles["elasticrun"] == consoles["torchrun"] == ["[default0]:out 0 0"]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_an_unknown_name_stops_both_launchers_before_any_worker_starts(tmp_path, plugin_env, launcher):
    result, marks = launch(launcher, tmp_path, plugin_env, "--logs-specs=flatt")
    assert result.returncode != 0 and list(marks.iterdir()) == []
    if launcher == "elasticrun":
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert result.stderr.splitlines() == [
            "elasticrun: error: --logs-specs: no entry point 'flatt' in the torchrun.logs_specs group (installed: "
            "broken, default, flat); install the package that provides it"]
    else:
        assert "Could not find entrypoint under 'torchrun.logs_specs[flatt]' key" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_a_plugin_that_cannot_load_stops_both_launchers_before_any_worker_starts(tmp_path, plugin_env, launcher):
    result, marks = launch(launcher, tmp_path, plugin_env, "--logs-specs=broken")
    assert result.returncode != 0 and list(marks.iterdir()) == []
    if launcher == "elasticrun":
        assert "Traceback" not in result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("elasticrun: ")]
        assert errors == ["elasticrun: --logs-specs broken: AttributeError: module 'flatlogs' has no attribute "
                          "'NoSuchClass'"]
        assert "joined" not in result.stderr  # stopped before the rendezvous, as torchrun
