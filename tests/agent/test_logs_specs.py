"""``--logs-specs``: a real torch ``LogsSpecs`` plugin, run in its helper, places real workers' logs.

The plugin is ``support.flat_logs`` (a distribution installed into a temporary
directory on ``PYTHONPATH``) or torch's own ``default``. Each helper imports torch, so the hosts
are shared per module where the tests only read from them.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

import pytest

from elastic.agent.errors import WorkerStartError
from elastic.agent.groups import worker_groups
from elastic.agent.processes.logs_specs import LogsSpecsError, LogsSpecsHost, logs_specs_host
from elastic.agent.processes.output import RankDest
from elastic.agent.processes.group_state import GroupStatus
from elastic.agent.processes.group_settings import GroupSettings
from elastic.agent.processes.workers import WorkerGroup
from elastic.config import Entrypoint, LaunchConfig, Std, StdMask
from elastic.rendezvous.api import RendezvousInfo

from support.flat_logs import install_flat_logs

pytestmark = pytest.mark.slow  # every helper imports torch


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return install_flat_logs(tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="module")
def environ(site) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))


def host(name: str, environ, log_dir, **masks) -> LogsSpecsHost:
    return LogsSpecsHost(name, sys.executable, environ, log_dir=str(log_dir),
                         redirects=masks.get("redirects", StdMask(Std.ALL)), tee=masks.get("tee", StdMask()),
                         local_ranks_filter=masks.get("local_ranks_filter"))


@pytest.fixture(scope="module")
def flat(environ, tmp_path_factory):
    logs = tmp_path_factory.mktemp("flat")
    started = host("flat", environ, logs, tee=StdMask(Std.NONE, {0: Std.OUT}), local_ranks_filter=frozenset({0}))
    started.start()
    yield started, logs
    started.close()


def envs(run_id: str = "job", restart: int = 0, ranks: int = 2) -> dict[int, dict[str, str]]:
    return {rank: {"TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": str(restart), "LOCAL_RANK": str(rank)}
            for rank in range(ranks)}


def test_the_plugin_decides_each_ranks_files_and_environment(flat):
    plugin, logs = flat
    assert plugin.wait_ready() == str(logs / "flat")
    plan = plugin.reify(envs(restart=2))
    base = str(logs / "flat" / "job-r2-")
    assert plan.dests == {
        0: RankDest(base + "0.out", base + "0.err", tee_stdout=True, tee_stderr=False, error_file=base + "0.error.json"),
        1: RankDest(base + "1.out", base + "1.err", tee_stdout=False, tee_stderr=False, error_file=base + "1.error.json"),
    }
    assert plan.env == {rank: {"TORCHELASTIC_ERROR_FILE": base + f"{rank}.error.json", "FLAT_LOGS": str(rank)}
                        for rank in (0, 1)}
    assert plan.root_log_dir == str(logs / "flat")


def test_one_plugin_instance_serves_every_attempt(flat):
    plugin, _ = flat
    first, second = plugin.reify(envs("a", 0)), plugin.reify(envs("a", 1, ranks=3))
    assert first.dests[0].stdout.endswith("a-r0-0.out") and second.dests[2].stdout.endswith("a-r1-2.out")


def test_torchs_default_plugin_gives_torchs_layout(environ, tmp_path):
    default = host("default", environ, tmp_path, redirects=StdMask(Std.OUT), tee=StdMask(Std.ERR))
    try:
        plan = default.reify(envs("job"))
    finally:
        default.close()
    attempt = Path(plan.dests[0].stdout).parent.parent
    assert attempt.name == "attempt_0" and attempt.parent.name.startswith("job_") and attempt.parent.parent == tmp_path
    assert plan.dests[1] == RankDest(str(attempt / "1" / "stdout.log"), str(attempt / "1" / "stderr.log"),
                                     tee_stdout=False, tee_stderr=True, error_file=str(attempt / "1" / "error.json"))


@pytest.mark.parametrize("name, says", [
    ("broken", "--logs-specs broken: AttributeError: "),
    ("not-installed", "--logs-specs not-installed: LookupError: no entry point 'not-installed' in the "
                      "torchrun.logs_specs group of "),
])
def test_a_plugin_that_cannot_load_is_one_line_and_stops_the_helper(environ, tmp_path, name, says):
    failing = host(name, environ, tmp_path)
    with pytest.raises(LogsSpecsError) as raised:
        failing.wait_ready()
    assert str(raised.value).startswith(says) and "\n" not in str(raised.value)
    with pytest.raises(LogsSpecsError, match=says):
        failing.reify(envs())  # the same answer, without asking again
    failing.close()


def test_a_reify_that_raises_is_one_line_and_the_helper_answers_the_next(flat):
    plugin, _ = flat
    with pytest.raises(LogsSpecsError, match=r"^--logs-specs flat: reify failed: KeyError: 'TORCHELASTIC_RUN_ID'$"):
        plugin.reify({0: {"TORCHELASTIC_RESTART_COUNT": "0"}})
    assert plugin.reify(envs("after")).dests[0].stdout.endswith("after-r0-0.out")


def test_a_helper_that_cannot_start_torch_is_named(tmp_path):
    nowhere = LogsSpecsHost("flat", str(tmp_path / "no-python"), {}, log_dir=None, redirects=StdMask(),
                            tee=StdMask(), local_ranks_filter=None)
    with pytest.raises(LogsSpecsError, match="cannot start .*no-python"):
        nowhere.wait_ready()


# -- worker groups placed by the plugin --------------------------------------------------------


WORKER = """
import os, sys
print("out", os.environ["RANK"], os.environ["FLAT_LOGS"], flush=True)
print("err", os.environ["RANK"], file=sys.stderr, flush=True)
if os.environ["LOCAL_RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
        f.write('{"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": "tb"}}}')
    sys.exit(3)
"""


def group(tmp_path, environ, plugin: LogsSpecsHost | None, restart_count: int = 0, **cfg) -> WorkerGroup:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, entrypoint=Entrypoint("script", str(script)),
                          logs_specs="flat", log_dir=str(tmp_path / "logs"), redirects=StdMask(Std.ALL),
                          tee=StdMask(Std.NONE, {0: Std.OUT}), local_ranks_filter=frozenset({0}), **cfg)
    info = RendezvousInfo(run_id="job", round=0, group_rank=0, group_world_size=1, master_addr="127.0.0.1",
                          master_port=29999, members=())
    return WorkerGroup(config, info, attempt=restart_count, restart_count=restart_count,
                       settings=GroupSettings(environ=environ, logs_specs=plugin))


def run(worker_group: WorkerGroup):
    worker_group.start()
    try:
        state = worker_group.wait(30)
        while state.running:
            state = worker_group.wait(30)
    finally:
        final = worker_group.stop(timeout=2)
    return final


def test_workers_write_where_the_plugin_says_with_its_environment_and_prefixed_tee(flat, environ, tmp_path, capfd):
    plugin, logs = flat
    first = group(tmp_path, environ, plugin)
    state = run(first)
    assert state.status is GroupStatus.FAILED and [f.local_rank for f in state.failures] == [1]
    flat_dir = logs / "flat"
    assert (flat_dir / "job-r0-0.out").read_text() == "out 0 0\n"
    assert (flat_dir / "job-r0-1.err").read_text() == "err 1\n"
    assert state.failures[0].error_file == str(flat_dir / "job-r0-1.error.json")
    assert "RuntimeError: boom" in first.failure_report("host")  # the plugin's error file is read
    assert first.log_dir == str(flat_dir)
    out, _ = capfd.readouterr()
    assert "[default0]:out 0 0\n" in out and "out 1" not in out  # rank 0 tee'd; rank 1 filtered out

    second = group(tmp_path, environ, plugin, restart_count=1)
    assert run(second).status is GroupStatus.SUCCEEDED
    assert (flat_dir / "job-r1-1.out").read_text() == "out 1 1\n"


def test_a_plugin_that_fails_starts_no_worker(environ, tmp_path):
    broken = host("broken", environ, tmp_path)
    try:
        failing = group(tmp_path, environ, broken)
        with pytest.raises(WorkerStartError, match="^Run job: --logs-specs broken: AttributeError"):
            failing.start()
        assert failing.pids() == {}
    finally:
        broken.close()


def test_each_launch_makes_its_own_helper_and_a_group_needs_the_one_it_is_given(environ, tmp_path):
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, entrypoint=Entrypoint("script", "t.py"),
                          logs_specs=f"flat-{uuid.uuid4().hex[:6]}", tee=StdMask(Std.NONE, {1: Std.ERR}))
    first, second = (logs_specs_host(config, environ, sys.executable) for _ in range(2))
    assert first is not second and first.name == second.name == config.logs_specs  # no process-wide helper
    with pytest.raises(ValueError):
        logs_specs_host(LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, entrypoint=config.entrypoint),
                        environ, sys.executable)
    info = RendezvousInfo(run_id="job", round=0, group_rank=0, group_world_size=1, master_addr="127.0.0.1",
                          master_port=29999, members=())
    with pytest.raises(ValueError, match=f"^--logs-specs {config.logs_specs}: the worker group was given no helper"):
        WorkerGroup(config, info, attempt=0, settings=GroupSettings(environ=environ))


def test_the_agents_group_factory_hands_every_group_the_helper_it_was_given(flat, environ, tmp_path):
    plugin, logs = flat
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, entrypoint=Entrypoint("script", str(script)),
                          logs_specs="flat", log_dir=str(tmp_path / "logs"), redirects=StdMask(Std.ALL))
    info = RendezvousInfo(run_id="factory", round=0, group_rank=0, group_world_size=1, master_addr="127.0.0.1",
                          master_port=29999, members=())
    made = worker_groups(config, "node-a", None, plugin)(info, attempt=0, restart_count=0, use_agent_store=False)
    run(made)
    assert (logs / "flat" / "factory-r0-0.out").read_text() == "out 0 0\n"


def test_closing_a_helper_that_still_imports_torch_kills_it_at_once(tmp_path):
    slow = tmp_path / "slow-torch"
    (slow / "torch").mkdir(parents=True)
    (slow / "torch" / "__init__.py").write_text("import time\ntime.sleep(60)\n")
    importing = LogsSpecsHost("flat", sys.executable, dict(os.environ, PYTHONPATH=str(slow)), log_dir=None,
                              redirects=StdMask(), tee=StdMask(), local_ranks_filter=None)
    importing.start()
    proc = importing._proc
    time.sleep(0.3)  # well into its import
    started = time.monotonic()
    importing.close()
    assert time.monotonic() - started < 1.0  # not the 2 s a ready helper gets to exit
    assert proc.returncode is not None  # reaped: no orphan left
