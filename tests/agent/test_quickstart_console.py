"""The quick start's console: a few agent lines, no JSON, no UUIDs, a summary at exit.

Runs the README's quick-start command (``elasticrun --standalone --nproc-per-node=2
examples/train_ddp.py``, as ``python -m elastic.run``) with real gloo workers, and counts what
the agent prints beside the workers' output: three lines, as the README says (the
OMP_NUM_THREADS notice, the world formed, the summary), and nothing from torch or numpy.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from elastic.testing.agents import Launched, clean_env

pytestmark = pytest.mark.slow  # starts torch workers

REPO = Path(__file__).resolve().parents[2]
QUICK_START = ["--standalone", "--nproc-per-node=2", "examples/train_ddp.py"]
OMP_LINE = ("elasticrun: OMP_NUM_THREADS is not set: each of this node's 2 workers gets OMP_NUM_THREADS=1 "
            "(torchrun's default, so they do not overload the machine); set it yourself to tune")
FAILURE_TAIL = 12000
"""How much of the agent's stderr a failure quotes: with ``-v`` its own lines come between the workers'."""
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def run_quick_start(tmp_path: Path, *extra: str, **env: str) -> Launched:
    """The quick start's agent, exited 0 with the last step done; else a failure that quotes the
    agent's stderr (the workers' own stderr comes through it, untouched by default) and the
    workers' prints. ``PYTHONFAULTHANDLER``: a worker killed by a signal (a rare SIGABRT inside
    torch was seen once) prints the Python stacks of its threads there too."""
    agent = Launched([sys.executable, "-m", "elastic.run", *extra, *QUICK_START], name="quickstart", logdir=tmp_path,
                     env=clean_env(TMPDIR=str(tmp_path), PYTHONFAULTHANDLER="1", **env), cwd=REPO, new_session=True,
                     timeout=180)
    try:
        assert agent.wait() == 0, agent.describe(FAILURE_TAIL, stdout_chars=2000)
    finally:
        agent.kill_tree()
    assert "done: 200 steps" in agent.stdout, agent.describe(FAILURE_TAIL, stdout_chars=2000)
    return agent


def agent_lines(stderr: str) -> list[str]:
    """The agent's lines without its OMP_NUM_THREADS notice (torchrun prints a four-line banner),
    which comes once, after the set-up (``-v``: after its lines) and before the workers start."""
    lines = stderr.splitlines()
    at = next((i for i, line in enumerate(lines) if line.endswith(OMP_LINE.removeprefix("elasticrun: "))), None)
    assert at is not None and [line for line in lines if OMP_LINE.removeprefix("elasticrun: ") in line] == [lines[at]], \
        stderr[-3000:]
    assert not [line for line in lines[:at] if "formed a world" in line], stderr[-3000:]  # before the workers
    return lines[:at] + lines[at + 1:]


def test_the_quick_start_prints_three_agent_lines_without_json_and_a_summary(tmp_path):
    agent = run_quick_start(tmp_path)
    lines = agent_lines(agent.stderr)
    assert len(lines) == 2, lines  # the README: the notice, the world formed, the summary
    assert all(line.startswith("elasticrun: ") for line in lines), lines  # the workers print nothing to stderr
    assert not [line for line in lines if "{" in line or UUID.search(line)], lines
    formed, summary = lines[0], lines[-1]
    assert re.fullmatch(r"elasticrun: run [0-9a-f]{8} round 0: formed a world of 2 workers on 1 node; "
                        r"node \S+ runs ranks 0-1", formed), lines
    assert re.fullmatch(r"elasticrun: run [0-9a-f]{8} node \S+: succeeded after \d+\.\ds; 1 attempt, no restarts",
                        summary), lines


def test_verbose_shows_the_rest_and_the_events_go_to_the_event_log_only(tmp_path):
    events = tmp_path / "events.jsonl"
    agent = run_quick_start(tmp_path, "-v", f"--event-log={events}")
    lines = agent.stderr.splitlines()
    assert [line for line in lines if line.endswith(" elasticrun INFO: " + OMP_LINE.removeprefix("elasticrun: "))], lines
    assert len(lines) > 5 and all(re.match(r"\[\d{4}-\d\d-\d\d [\d:,]+\] elasticrun INFO: ", line) for line in lines)
    assert "closed round 0" in agent.stderr and "\"event\"" not in agent.stderr  # no JSON event lines
    assert "succeeded after" in lines[-1]
    names = [json.loads(line)["event"] for line in events.read_text().splitlines()]
    assert names == ["round_joined", "workers_started", "job_finished"]
