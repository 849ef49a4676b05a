"""The agent's error tree: one base, the built-in mixins callers catch by, causes kept, and one
line for the user."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from elastic.agent.errors import (
    AgentError,
    EventLogError,
    LifelineError,
    MetricsServerError,
    PidFileError,
    StoreHostError,
    WorkerStartError,
)
from elastic.agent.observe.events import EventLog
from elastic.agent.lifeline.keeper import Lifeline


@pytest.mark.parametrize(
    ("error", "mixin"),
    [
        (WorkerStartError, RuntimeError),
        (StoreHostError, RuntimeError),
        (MetricsServerError, RuntimeError),
        (PidFileError, ValueError),
        (EventLogError, ValueError),
        (LifelineError, OSError),
    ],
)
def test_every_agent_error_is_an_agent_error_and_keeps_the_builtin_its_callers_catch(error, mixin):
    assert issubclass(error, AgentError) and issubclass(error, mixin)


def test_the_public_modules_still_export_their_errors():
    from elastic.agent.lifeline import pidfile
    from elastic.agent.observe import metrics_server
    from elastic.agent.processes import store_host, workers

    assert (workers.WorkerStartError, store_host.StoreHostError, metrics_server.MetricsServerError,
            pidfile.PidFileError) == (WorkerStartError, StoreHostError, MetricsServerError, PidFileError)


def test_an_event_log_that_cannot_be_opened_is_translated_with_its_cause(tmp_path):
    with pytest.raises(EventLogError, match="cannot be opened for appending") as raised:
        EventLog(str(tmp_path), run_id="r", node="n")  # a directory
    assert isinstance(raised.value.__cause__, OSError)


def test_a_state_directory_that_is_a_symlink_is_refused_as_a_lifeline_error(tmp_path):
    target = tmp_path / "real"
    target.mkdir()
    (tmp_path / "state").symlink_to(target)  # a PID file found through it could name any process
    with pytest.raises(LifelineError, match="not a directory owned by this user"):
        Lifeline.open(str(tmp_path / "state"), "run", "node", watchdog=False)


@pytest.mark.parametrize("case", ["event_log", "metrics_port"])
def test_setup_errors_reach_the_user_as_one_line_without_a_traceback(tmp_path, case):
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('the workers must not start')\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        flag = {"event_log": f"--event-log={tmp_path}",
                "metrics_port": f"--metrics-port={taken.getsockname()[1]}"}[case]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
        result = subprocess.run(
            [sys.executable, "-m", "elastic.run", "--standalone", "--nproc-per-node=1",
             f"--log-dir={tmp_path / 'logs'}", flag, str(script)],
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, env=env,
        )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("elasticrun: ")]
    assert ("cannot be opened" if case == "event_log" else "--metrics-port") in line
