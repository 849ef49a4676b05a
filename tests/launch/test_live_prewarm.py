"""``--live-recovery`` pre-warms by default: the decision, the command line, ``--dry-run``, and a
real template importing the live default modules (``elastic.launch.prewarm_flags``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from elastic.agent.prewarm.control import TemplateState
from elastic.agent.prewarm.pool import TemplatePool
from elastic.launch.cli import ConfigError, config_from_args
from elastic.launch.describe import describe
from elastic.launch.devices import FixedDevices
from elastic.launch.flags import LIVE_PREWARM_MODULES
from elastic.launch.prewarm_flags import PrewarmAsked, PrewarmChoice, PrewarmConflict, choose_prewarm

REPO = Path(__file__).resolve().parents[2]
LIVE = ("--standalone", "--live-recovery")
"""A rendezvous with rounds, which ``--live-recovery`` needs."""
LIVE_MODULES = ("torch", "torch.distributed", "torch._dynamo", "elastic.worker.live")


def test_the_live_default_modules_are_what_the_live_tests_measured():
    assert LIVE_PREWARM_MODULES == LIVE_MODULES


# -- the decision ------------------------------------------------------------------------------

DECISIONS = [
    # (prewarm, no_prewarm, modules, live_recovery, python) -> (on, modules, ignored_ask)
    ((False, False, None, False, True), (False, ("torch",), False)),
    ((True, False, None, False, True), (True, ("torch",), False)),
    ((False, True, None, False, True), (False, ("torch",), False)),
    ((False, False, None, True, True), (True, LIVE_MODULES, False)),
    ((True, False, None, True, True), (True, LIVE_MODULES, False)),
    ((False, True, None, True, True), (False, LIVE_MODULES, False)),
    ((False, False, ("json",), True, True), (True, ("json",), False)),
    ((True, False, ("json",), False, True), (True, ("json",), False)),
    ((False, False, None, True, False), (False, LIVE_MODULES, False)),  # implied, not Python: silently off
    ((True, False, None, True, False), (False, LIVE_MODULES, True)),  # asked, not Python: said to be ignored
    ((True, False, None, False, False), (False, ("torch",), True)),
]


@pytest.mark.parametrize("asked, chosen", DECISIONS, ids=[str(case[0]) for case in DECISIONS])
def test_prewarm_is_on_when_asked_or_implied_by_live_recovery_and_only_for_python(asked, chosen):
    assert choose_prewarm(PrewarmAsked(*asked)) == PrewarmChoice(*chosen)


@pytest.mark.parametrize("live", [False, True])
def test_asking_for_prewarm_and_refusing_it_is_a_conflict(live):
    with pytest.raises(PrewarmConflict):
        choose_prewarm(PrewarmAsked(True, True, None, live, True))


# -- the command line --------------------------------------------------------------------------


def parse(*argv: str, environ: dict[str, str] | None = None):
    warnings: list[str] = []
    config = config_from_args(list(argv), environ or {}, devices=FixedDevices(cpus=2, gpus=0),
                              new_run_id=lambda: "run", warn=warnings.append)
    return config, warnings


COMMAND_LINES = [
    # (argv, environ, prewarm, modules shown by --dry-run)
    ((*LIVE, "t.py"), {}, True, ",".join(LIVE_MODULES)),
    ((*LIVE, "--no-prewarm", "t.py"), {}, False, "none (no prewarm)"),
    ((*LIVE, "--no_prewarm", "t.py"), {}, False, "none (no prewarm)"),
    ((*LIVE, "t.py"), {"PET_NO_PREWARM": "1"}, False, "none (no prewarm)"),
    ((*LIVE, "t.py"), {"PET_NO_PREWARM": "0"}, True, ",".join(LIVE_MODULES)),
    ((*LIVE, "--prewarm-modules", "torch,numpy", "t.py"), {}, True, "torch,numpy"),
    ((*LIVE, "t.py"), {"PET_PREWARM_MODULES": "json"}, True, "json"),
    ((*LIVE, "--prewarm", "t.py"), {}, True, ",".join(LIVE_MODULES)),
    (("t.py",), {"PET_LIVE_RECOVERY": "1", "PET_STANDALONE": "1"}, True, ",".join(LIVE_MODULES)),
    ((*LIVE, "-m", "train"), {}, True, ",".join(LIVE_MODULES)),
    ((*LIVE, "--no-python", "t.sh"), {}, False, "none (no prewarm)"),
    (("--standalone", "t.py"), {}, False, "none (no prewarm)"),
    (("--standalone", "--no-prewarm", "t.py"), {}, False, "none (no prewarm)"),
    (("--standalone", "--prewarm", "t.py"), {}, True, "torch"),
    (("--standalone", "--prewarm-modules", "json", "t.py"), {}, False, "none (no prewarm)"),
]


@pytest.mark.parametrize("argv, environ, prewarm, modules", COMMAND_LINES,
                         ids=[" ".join(case[0]) + " " + ",".join(case[1]) for case in COMMAND_LINES])
def test_live_recovery_prewarms_unless_told_not_to_and_dry_run_says_so(argv, environ, prewarm, modules):
    config, warnings = parse(*argv, environ=environ)
    assert config.prewarm is prewarm and warnings == []
    rows = dict(line.split(":", 1) for line in describe(config).splitlines())
    assert (rows["prewarm"].strip(), rows["prewarm_modules"].strip()) == ("yes" if prewarm else "no", modules)


def test_an_asked_prewarm_with_no_python_is_still_said_to_be_ignored_under_live_recovery():
    config, warnings = parse(*LIVE, "--prewarm", "--no-python", "t.sh")
    assert not config.prewarm
    assert warnings == ["--prewarm is ignored with --no-python: the workers are not Python, so they start as usual"]


REFUSED = [
    (("--prewarm", "--no-prewarm", "t.py"), {}, "--prewarm and --no-prewarm cannot be used together"),
    ((*LIVE, "--prewarm", "--no-prewarm", "t.py"), {}, "--prewarm and --no-prewarm cannot be used together"),
    (("--no-prewarm", "t.py"), {"PET_PREWARM": "1"}, "PET_PREWARM=1 and --no-prewarm cannot be used together"),
    (("--prewarm", "t.py"), {"PET_NO_PREWARM": "yes"}, "--prewarm and PET_NO_PREWARM=yes cannot be used together"),
    (("t.py",), {"PET_NO_PREWARM": "maybe"}, "--no-prewarm (from PET_NO_PREWARM): 'maybe' is not 1 or 0"),
    (("--no-prewarm=1", "t.py"), {}, "--no-prewarm: a switch takes no value (got '1')"),
]


@pytest.mark.parametrize("argv, environ, starts", REFUSED, ids=[" ".join(case[0]) for case in REFUSED])
def test_prewarm_and_no_prewarm_together_are_refused_in_one_line(argv, environ, starts):
    with pytest.raises(ConfigError) as raised:
        parse(*argv, environ=environ)
    assert str(raised.value).startswith(starts) and "\n" not in str(raised.value)


def test_the_entry_point_refuses_prewarm_with_no_prewarm_with_exit_2_and_one_line():
    environ = {key: value for key, value in os.environ.items() if not key.startswith("PET_")}
    result = subprocess.run([sys.executable, "-m", "elastic.run", "--prewarm", "--no-prewarm", "t.py"],
                            capture_output=True, text=True, env=environ, timeout=60, check=False)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("elasticrun: error: --prewarm and --no-prewarm cannot be used together: drop one "
                             "(--live-recovery turns --prewarm on by itself)\n")


# -- a real template ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.needs_torch
def test_a_template_importing_the_live_default_modules_is_accepted(tmp_path):
    """The default must pass the fork check (no CUDA, no thread that outlives a fork), or every
    live job would fall back to normal starts with a warning."""
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    config, _ = parse(*LIVE, str(script))
    environ = dict(os.environ, PYTHONPATH=str(REPO))
    pool = TemplatePool(config, environ, sys.executable, cwd=str(tmp_path))
    try:
        pool.start()
        [template] = pool.templates().values()
        state = template.wait_ready(120)
        assert state is TemplateState.READY, template.reason
        assert template.ready_info["os_threads_after_fork"] in (1, None)
    finally:
        pool.close()
