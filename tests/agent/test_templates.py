"""Pre-warmed worker templates (``--prewarm``): the wire, the refusal decision, real templates.

Unit tests feed the framing bytes and the decision probes. The rest start real template
processes through :class:`TemplatePool` and real workers through :class:`WorkerGroup`; every
template is closed and every worker killed by its pid at the end. Tests that import torch in a
template are marked slow. CUDA cannot be initialised on a CPU machine: the CUDA refusal is
tested through the decision and through a module that makes ``torch.cuda.is_initialized``
answer True in a real template (the probe's input is faked, the template and refusal are real).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import struct
import sys
import textwrap
import uuid

import psutil
import pytest

from elastic.agent.prewarm.check import TemplateProbe, judge_template, probe_template
from elastic.agent.prewarm.template import _job as template_job
from elastic.agent.prewarm.wire import (FrameReader, TemplateWireError, WorkerJob, encode, fork_request,
                                         read_fork_request)
from elastic.agent.prewarm.control import TemplateState
from elastic.agent.prewarm.pool import TemplatePool, worker_path0
from elastic.agent.processes.group_state import GroupStatus
from elastic.agent.processes.group_settings import GroupSettings
from elastic.agent.processes.workers import WorkerGroup
from elastic.config import Entrypoint, LaunchConfig, Std, StdMask
from elastic.rendezvous.api import RendezvousInfo
from elastic.testing.ports import free_port

# -- the wire ----------------------------------------------------------------------------------


def test_a_frame_round_trips_even_when_split_into_single_bytes():
    message = {"op": "fork", "env": {"A": "1"}, "args": ["x", "${local_rank}"]}
    frames = encode(message) + encode({"op": "stop"})
    reader = FrameReader()
    got = []
    for i in range(len(frames)):
        got.extend(reader.feed(frames[i:i + 1]))
    assert got == [message, {"op": "stop"}] and reader.pending == 0


@pytest.mark.parametrize("frame, says", [
    (struct.pack(">I", 2 ** 31), "announces 2147483648 bytes"),
    (struct.pack(">I", 3) + b"{x}", "not JSON"),
    (struct.pack(">I", 2) + b"[]", "holds list, not an object"),
    (struct.pack(">I", 2) + b"\xff\xfe", "not JSON"),
])
def test_a_bad_frame_is_refused_without_buffering_it(frame, says):
    with pytest.raises(TemplateWireError, match=says):
        FrameReader(limit=1024).feed(frame)


def test_an_oversized_frame_is_refused_from_its_header_alone():
    reader = FrameReader(limit=16)
    with pytest.raises(TemplateWireError):
        reader.feed(struct.pack(">I", 17))
    assert reader.pending == 4  # the body was never waited for


def test_a_message_too_large_to_send_is_refused():
    with pytest.raises(TemplateWireError, match="exceeds 64 bytes"):
        encode({"env": "x" * 100}, limit=64)
    with pytest.raises(TemplateWireError, match="cannot be encoded"):
        encode({"fds": object()})


def test_a_fork_request_carries_the_job_through_a_frame_unchanged():
    job = WorkerJob("module", "pkg.train", ("--lr", "0.1"), {"RANK": "3", "PATH": "/bin"}, "/work", "/work")
    (message,) = FrameReader().feed(encode(fork_request(job, 2)))
    assert message["op"] == "fork" and message["fds"] == 2
    assert read_fork_request(message) == job


def test_a_fork_request_names_the_variables_of_the_descriptors_it_hands_on():
    job = WorkerJob("script", "t.py", (), {"ELASTIC_ROUND_FD": "9"}, "/", "/", inherited=("ELASTIC_ROUND_FD",))
    (message,) = FrameReader().feed(encode(fork_request(job, 3)))
    assert read_fork_request(message) == job
    with pytest.raises(TemplateWireError, match="carries 2 descriptors; stdout, stderr and 1 inherited need 3"):
        template_job(message, [10, 11])  # the descriptor it names is missing
    forked = template_job(message, [10, 11, 12])
    assert (forked.stdout_fd, forked.stderr_fd, forked.inherited) == (10, 11, (("ELASTIC_ROUND_FD", 12),))


@pytest.mark.parametrize("change, says", [
    ({"kind": "command"}, "entrypoint kind 'command'"),
    ({"target": None, "kind": None}, "entrypoint kind 'None'"),
    ({"args": 5}, "malformed"),
    ({"env": ["A=1"]}, "malformed"),
    ({"cwd": KeyError}, "malformed"),  # missing
])
def test_a_malformed_fork_request_is_refused_with_one_line(change, says):
    message = fork_request(WorkerJob("script", "t.py", (), {}, "/", "/"), 2)
    for key, value in change.items():
        if value is KeyError:
            del message[key]
        else:
            message[key] = value
    with pytest.raises(TemplateWireError, match=says):
        read_fork_request(message)


# -- the refusal decision ----------------------------------------------------------------------

CASES = [
    # (cuda, python threads, OS threads after the trial fork, refused because of)
    (None, (), 1, None),  # no torch, one thread
    (False, (), 1, None),  # torch imported; OpenBLAS's pool stopped for the fork
    (False, (), None, None),  # no /proc: the other rules only
    (True, (), 1, "CUDA is initialised"),
    (False, ("poller",), 2, "Python threads are running (poller)"),
    (False, (), 3, "2 OS thread(s) outlive a fork"),
    (True, ("a", "b"), 3, "CUDA is initialised (a CUDA context does not survive a fork); Python threads are "
                          "running (a, b); 2 OS thread(s)"),
]


@pytest.mark.parametrize("cuda, threads, after, refused", CASES)
def test_a_template_is_refused_exactly_when_something_would_not_survive_a_fork(cuda, threads, after, refused):
    reason = judge_template(TemplateProbe(cuda, threads, 2, after))
    if refused is None:
        assert reason is None
    else:
        assert reason is not None and reason.startswith(refused) and "--prewarm" in reason


def test_the_probe_forks_once_and_counts_threads_after_the_fork_in_the_parent():
    counts = iter([2, 1])
    probe = probe_template(cuda_initialized=lambda: True, task_count=lambda: next(counts))
    assert probe == TemplateProbe(True, (), 2, 1)


def test_path0_is_what_python_puts_first_on_sys_path(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "train.py").write_text("")
    os.symlink(tmp_path / "real" / "train.py", tmp_path / "link.py")
    assert worker_path0(Entrypoint("script", "link.py"), str(tmp_path)) == str(tmp_path / "real")
    assert worker_path0(Entrypoint("module", "pkg.train"), str(tmp_path)) == str(tmp_path)
    assert worker_path0(Entrypoint("run_path", "/abs/train.py"), str(tmp_path)) == ""


# -- real templates ----------------------------------------------------------------------------


class Templates:
    """Builds groups with templates for one test; closes every pool and kills every worker."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.out = tmp_path / "out"
        self.out.mkdir()
        self.run_id = f"tpl-{uuid.uuid4().hex[:8]}"
        self.pools: list[TemplatePool] = []
        self.groups: list[WorkerGroup] = []
        self.pids: set[int] = set()
        sys.path.insert(0, str(tmp_path))  # not needed by the agent: for the modules' own imports

    def module(self, name: str, body: str) -> str:
        (self.tmp / f"{name}.py").write_text(textwrap.dedent(body))
        return name

    def config(self, body: str, *, nproc: int = 1, modules: tuple[str, ...] = ("json",), kind: str = "script",
               args: tuple[str, ...] = (), **cfg) -> LaunchConfig:
        path = self.tmp / "worker.py"
        path.write_text(textwrap.dedent(body))
        target = str(path) if kind != "module" else "worker"
        cfg.setdefault("redirects", StdMask(Std.ALL))
        return LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=self.run_id,
                            entrypoint=Entrypoint(kind, target, args), prewarm=True, prewarm_modules=modules,
                            **cfg)

    def pool(self, config: LaunchConfig, **kwargs) -> TemplatePool:
        pool = TemplatePool(config, self.environ(), sys.executable, cwd=str(self.tmp), **kwargs)
        self.pools.append(pool)
        pool.start()
        return pool

    def environ(self) -> dict[str, str]:
        return dict(os.environ, TEST_OUT=str(self.out), PYTHONPATH=str(self.tmp))

    def run(self, config: LaunchConfig, pool: TemplatePool | None, attempt: int = 0, timeout: float = 60.0):
        info = RendezvousInfo(run_id=self.run_id, round=attempt, group_rank=0, group_world_size=1,
                              master_addr="127.0.0.1", master_port=free_port(), members=())
        group = WorkerGroup(config, info, attempt=attempt,
                            settings=GroupSettings(log_root=str(self.tmp / "logs"), environ=self.environ(), templates=pool))
        self.groups.append(group)
        group.start()
        self.pids.update(group.pids().values())
        state = group.wait(timeout)
        while state.status is GroupStatus.RUNNING:
            state = group.wait(timeout)
        group.stop(timeout=5)
        return group, state

    def close(self) -> None:
        for group in self.groups:
            group.stop(timeout=0)
        for pid in self.pids:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        for pool in self.pools:
            pool.close()
        sys.path.remove(str(self.tmp))


@pytest.fixture
def templates(tmp_path):
    t = Templates(tmp_path)
    try:
        yield t
    finally:
        t.close()


REPORT = """
import json, os, sys
out = os.path.join(os.environ["TEST_OUT"], "report." + os.environ["LOCAL_RANK"])
with open(out, "w") as f:
    json.dump({"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv, "path0": sys.path[0],
               "cwd": os.getcwd(), "sid": os.getsid(0), "name": __name__,
               "file": globals().get("__file__"), "rank": os.environ["RANK"]}, f)
"""


def report_of(templates: Templates, local_rank: int = 0) -> dict:
    return json.loads((templates.out / f"report.{local_rank}").read_text())


def test_a_worker_is_forked_from_its_template_and_sees_what_python_would_give_it(templates):
    config = templates.config(REPORT, nproc=2, args=("--lr", "${local_rank}"))
    pool = templates.pool(config)
    group, state = templates.run(config, pool)
    assert state.status is GroupStatus.SUCCEEDED
    for local_rank, template in pool.templates().items():
        report = report_of(templates, local_rank)
        assert report["ppid"] == template.pid  # forked, not started
        assert report["sid"] == report["pid"]  # its own session, as start_new_session
        assert report["argv"] == [str(templates.tmp / "worker.py"), "--lr", str(local_rank)]
        assert (report["path0"], report["cwd"]) == (str(templates.tmp), str(templates.tmp))
        assert (report["name"], report["file"]) == ("__main__", str(templates.tmp / "worker.py"))


def test_a_large_environment_reaches_the_forked_worker_whole(templates, monkeypatch):
    for i in range(4):  # more than one socket buffer in all: sent in pieces (exec takes <128 KiB a variable)
        monkeypatch.setenv(f"LARGE_{i}", "x" * 100_000)
    config = templates.config(REPORT + "\nassert sum(len(os.environ[f'LARGE_{i}']) for i in range(4)) == 400_000\n")
    pool = templates.pool(config)
    _, state = templates.run(config, pool)
    assert state.status is GroupStatus.SUCCEEDED and report_of(templates)["ppid"] == pool.templates()[0].pid


def test_a_template_serves_the_next_attempt_too(templates):
    config = templates.config(REPORT)
    pool = templates.pool(config)
    templates.run(config, pool, attempt=0)
    first = report_of(templates)
    templates.run(config, pool, attempt=1)
    second = report_of(templates)
    assert first["ppid"] == second["ppid"] == pool.templates()[0].pid and first["pid"] != second["pid"]


def test_a_module_entrypoint_runs_as_python_dash_m(templates):
    config = templates.config(REPORT, kind="module", args=("x",))
    pool = templates.pool(config)
    _, state = templates.run(config, pool)
    report = report_of(templates)
    assert state.status is GroupStatus.SUCCEEDED and report["ppid"] == pool.templates()[0].pid
    assert report["argv"] == [str(templates.tmp / "worker.py"), "x"] and report["path0"] == str(templates.tmp)


def test_a_run_path_entrypoint_runs_the_bootstrap_as_python_dash_c(templates):
    config = templates.config(REPORT, kind="run_path", args=("x",))
    pool = templates.pool(config)
    _, state = templates.run(config, pool)
    forked = report_of(templates)
    _, state2 = templates.run(config, None, attempt=1)
    normal = report_of(templates)
    assert state.status is state2.status is GroupStatus.SUCCEEDED and forked["ppid"] == pool.templates()[0].pid
    for key in ("argv", "path0", "name", "file"):  # (the cwd: the pool was given the test's)
        assert forked[key] == normal[key], key


@pytest.mark.parametrize("body, code, stderr_has", [
    ("import sys; sys.exit(3)", 3, None),
    ("import sys; sys.exit('bye')", 1, "bye"),
    ("def f():\n    raise ValueError('boom')\nf()", 1, "Traceback (most recent call last):\n  File \"{script}\", line 3"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -signal.SIGTERM, None),
    ("raise KeyboardInterrupt", -signal.SIGINT, "KeyboardInterrupt"),
    ("import atexit, sys; atexit.register(lambda: print('atexit ran', file=sys.stderr))", 0, "atexit ran"),
    ("x = (", 1, "SyntaxError"),
])
def test_a_forked_worker_exits_as_python_would(templates, body, code, stderr_has):
    config = templates.config(body)
    pool = templates.pool(config)
    group, state = templates.run(config, pool)
    script = str(templates.tmp / "worker.py")
    exit_codes = [f.exitcode for f in state.failures]
    assert exit_codes == ([code] if code else [])
    stderr = open(group.logs()[0].stderr).read()
    if stderr_has:
        assert stderr_has.format(script=script) in stderr
    group, state = templates.run(config, None, attempt=1)  # the same worker, started normally
    assert [f.exitcode for f in state.failures] == exit_codes
    assert open(group.logs()[0].stderr).read() == stderr  # the same words, the same frames


def test_a_template_whose_module_starts_a_thread_is_refused_and_the_worker_starts_normally(templates, caplog):
    modules = ("json", templates.module("threaded", """
        import threading, time
        threading.Thread(target=time.sleep, args=(3600,), name="poller", daemon=True).start()
    """))
    config = templates.config(REPORT, modules=modules)
    pool = templates.pool(config)
    with caplog.at_level(logging.WARNING):
        _, state = templates.run(config, pool)
    assert state.status is GroupStatus.SUCCEEDED
    assert report_of(templates)["ppid"] == os.getpid()  # started by the agent, the normal way
    refusals = [r.getMessage() for r in caplog.records if "was refused" in r.getMessage()]
    assert len(refusals) == 1 and "Python threads are running (poller)" in refusals[0]
    assert pool.templates() == {}


def test_a_template_that_cannot_import_a_module_is_refused(templates, caplog):
    config = templates.config(REPORT, modules=("no_such_module_here",))
    pool = templates.pool(config)
    with caplog.at_level(logging.WARNING):
        _, state = templates.run(config, pool)
    assert state.status is GroupStatus.SUCCEEDED and report_of(templates)["ppid"] == os.getpid()
    assert any("cannot import no_such_module_here: ModuleNotFoundError" in r.getMessage() for r in caplog.records)


def test_a_template_that_exits_before_it_is_ready_is_refused_not_replaced(templates, caplog):
    config = templates.config(REPORT, modules=(templates.module("exits", "import os; os._exit(3)"),))
    pool = templates.pool(config)
    with caplog.at_level(logging.WARNING):
        _, state = templates.run(config, pool)
        _, state = templates.run(config, pool, attempt=1)
    assert state.status is GroupStatus.SUCCEEDED and report_of(templates)["ppid"] == os.getpid()
    refusals = [r.getMessage() for r in caplog.records if "template" in r.getMessage()]
    assert len(refusals) == 1 and "it exited (3) before it was ready" in refusals[0]


def test_a_dead_template_is_replaced_and_its_worker_reported_killed(templates, caplog):
    config = templates.config("import time; time.sleep(60)")
    pool = templates.pool(config)
    info = RendezvousInfo(run_id=templates.run_id, round=0, group_rank=0, group_world_size=1,
                          master_addr="127.0.0.1", master_port=free_port(), members=())
    settings = GroupSettings(log_root=str(templates.tmp / "logs"), environ=templates.environ(), templates=pool)
    group = WorkerGroup(config, info, attempt=0, settings=settings)
    templates.groups.append(group)
    group.start()
    templates.pids.update(group.pids().values())
    dead = pool.templates()[0]
    os.kill(dead.pid, signal.SIGKILL)
    state = group.wait(10)
    assert state.status is GroupStatus.FAILED and state.failures[0].exitcode == -signal.SIGKILL
    group.stop(timeout=1)
    with caplog.at_level(logging.WARNING):
        config2 = templates.config(REPORT)
        _, state = templates.run(config2, pool, attempt=1)
    assert state.status is GroupStatus.SUCCEEDED and report_of(templates)["ppid"] == os.getpid()
    assert any("the worker template died" in r.getMessage() for r in caplog.records)
    fresh = pool.templates()[0]
    assert fresh is not dead and fresh.wait_ready(30) is TemplateState.READY


# -- with torch ---------------------------------------------------------------------------------

ALLREDUCE = """
import json, os, sys
from datetime import timedelta
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=timedelta(seconds=30))
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
out = os.path.join(os.environ["TEST_OUT"], "sum." + os.environ["LOCAL_RANK"])
with open(out, "w") as f:
    json.dump({"sum": t.item(), "ppid": os.getppid(), "env": dict(os.environ)}, f)
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.needs_torch
def test_prewarmed_workers_all_reduce_with_gloo_and_get_the_normal_environment(templates):
    config = templates.config(ALLREDUCE, nproc=2, modules=("torch",))
    pool = templates.pool(config)
    _, state = templates.run(config, pool)
    assert state.status is GroupStatus.SUCCEEDED
    prewarmed = {r: json.loads((templates.out / f"sum.{r}").read_text()) for r in (0, 1)}
    _, state = templates.run(config, None, attempt=1)
    assert state.status is GroupStatus.SUCCEEDED
    normal = {r: json.loads((templates.out / f"sum.{r}").read_text()) for r in (0, 1)}
    per_attempt = {"MASTER_PORT", "TORCHELASTIC_ERROR_FILE"}
    for r in (0, 1):
        assert prewarmed[r]["sum"] == normal[r]["sum"] == 3.0
        assert prewarmed[r]["ppid"] == pool.templates()[r].pid and normal[r]["ppid"] == os.getpid()
        ours = {k: v for k, v in prewarmed[r]["env"].items() if k not in per_attempt}
        theirs = {k: v for k, v in normal[r]["env"].items() if k not in per_attempt}
        assert ours == theirs


@pytest.mark.slow
@pytest.mark.needs_torch
def test_a_template_that_initialised_cuda_is_refused(templates, caplog):
    fake_cuda = templates.module("fake_cuda", """
        import torch
        torch.cuda.is_initialized = lambda: True  # what a CUDA machine's template would answer
    """)
    config = templates.config(REPORT, modules=("torch", fake_cuda))
    pool = templates.pool(config)
    with caplog.at_level(logging.WARNING):
        _, state = templates.run(config, pool)
    assert state.status is GroupStatus.SUCCEEDED and report_of(templates)["ppid"] == os.getpid()
    assert any("CUDA is initialised" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
@pytest.mark.needs_torch
def test_a_template_that_used_the_intra_op_thread_pool_is_refused(templates, caplog):
    busy = templates.module("busy_pool", """
        import torch
        torch.set_num_threads(2)
        torch.ones(2_000_000).mul_(2).sum()  # a parallel op: OpenMP's pool starts and stays
    """)
    config = templates.config(REPORT, modules=("torch", busy))
    pool = templates.pool(config)
    with caplog.at_level(logging.WARNING):
        _, state = templates.run(config, pool)
    assert state.status is GroupStatus.SUCCEEDED and report_of(templates)["ppid"] == os.getpid()
    assert any("outlive a fork" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
@pytest.mark.needs_torch
def test_torch_alone_passes_the_check_though_it_leaves_an_openblas_thread(templates):
    config = templates.config(REPORT, modules=("torch",), nproc=1)
    pool = templates.pool(config)
    template = pool.templates()[0]
    assert template.wait_ready(60) is TemplateState.READY
    assert template.ready_info["os_threads_after_fork"] == 1
    if (os.cpu_count() or 1) > 1 and not {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"} & set(os.environ):
        assert template.ready_info["os_threads_before_fork"] == 2  # OpenBLAS's blas_thread_server
    _, state = templates.run(config, pool)
    assert state.status is GroupStatus.SUCCEEDED and report_of(templates)["ppid"] == template.pid
