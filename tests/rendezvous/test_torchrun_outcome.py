"""The job's end and identity under stock torchrun with our plugin (issue 26 items 6 and 9).

torch 2.13's agent is run for real (``launch_agent``, in a child process, with a scripted
rendezvous behind our adapter) to check the order in which it calls the handler: the exit
barrier's first ``add`` comes only after the workers all succeeded, before ``shutdown()``,
and ``shutdown()`` sees no exception passing only on success. The slow tests run real torchrun
agents against the session's etcd.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest
import torch.distributed as dist
# torch's rendezvous package first: it loads our entry point as it is imported, and importing the
# plugin before it would make that load a circular import (etcd-v3 then stays unregistered).
import torch.distributed.elastic.rendezvous.registry  # noqa: F401
from torch.distributed.elastic.utils import store as store_util

from elastic.rendezvous.api import MembershipChange
from elastic.rendezvous.job import job_identity
from elastic.rendezvous.errors import JobFinishedError, JobMismatchError, RendezvousClosedError
from elastic.rendezvous.torchrun_outcome import EXIT_BARRIER_PREFIX, AgentStore, leaving_line, torchrun_job
from elastic.rendezvous.torchrun_plugin import TorchrunRendezvousHandler
from elastic.testing.agents import Launched
from test_torchrun_plugin import StubHandler, etcd_credentials, etcd_endpoint, logs, unique_run_id, torchrun_command

pytestmark = pytest.mark.needs_torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -- what the plugin reads from torch ------------------------------------------------------------
@pytest.mark.parametrize("argv, expected", [
    (["/venv/bin/torchrun", "--nnodes=2", "train.py", "--steps", "9"], ("script", "train.py", ["--steps", "9"])),
    (["/x/torch/distributed/run.py", "--nproc-per-node=2", "-m", "pkg.train", "--lr", "1"],
     ("module", "pkg.train", ["--lr", "1"])),
    (["/venv/bin/torchrun", "--no-python", "echo", "hi"], ("command", "echo", ["hi"])),
    (["/venv/bin/torchrun", "--max_re=1", "train.py"], ("script", "train.py", [])),  # torchrun's abbreviations
    (["my_program.py", "--steps", "9"], None),  # elastic_launch from a program: no command to read
])
def test_the_plugin_fingerprints_the_command_torchrun_was_given(argv, expected):
    found = torchrun_job(argv)
    assert found == (job_identity(*expected) if expected else None)


def test_outside_torchrun_only_an_explicit_fingerprint_identifies_the_job():
    assert torchrun_job(["my_program.py"], "exp-1").fingerprint == job_identity("script", "x", [], "exp-1").fingerprint


@pytest.mark.parametrize("change, expected", [
    (MembershipChange.JOB_FINISHED, 0),  # a peer finished: our workers may finish too
    (MembershipChange.JOB_FINISHED_ELSEWHERE, 1),  # restart: the join ends torchrun with 0
])
def test_the_jobs_end_restarts_nothing_that_may_still_finish(change, expected):
    assert TorchrunRendezvousHandler(StubHandler(0, change), "127.0.0.1").num_nodes_waiting() == expected


@pytest.mark.parametrize("cause, included, ok, says, code", [
    (JobFinishedError("m", "a", 3), True, False, "the job finished on node a in round 3; this node's workers failed", 0),
    (JobFinishedError("m", "a", 3), False, False, "the job finished on node a in round 3 while this node waited", 0),
    (JobFinishedError("m", "a", 3, joined=False), False, False,
     "the job finished on node a in round 3 before this node arrived; nothing to do, exit code 3", 3),
    (JobFinishedError("m", "a", 3, joined=False), False, True,
     "the job finished on node a in round 3 before this node arrived; nothing to do (", 0),
    (JobMismatchError("Rendezvous job: node b is refused: ..."), False, False, "Rendezvous job: node b is refused", 1),
    (RendezvousClosedError("closed", "node x gave up"), True, False, None, None),  # torch's agent handles it
    (None, True, False, None, None),
])
def test_torchrun_ends_in_one_line_only_for_the_jobs_end_or_another_job(cause, included, ok, says, code):
    leaving = leaving_line(cause, included, ok)
    if says is None:
        assert leaving is None
    else:
        assert leaving[0].startswith(says) and leaving[1] == code


def test_torchs_exit_barrier_on_the_agent_store_declares_first_then_runs_ours():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    calls: list[object] = []
    store = AgentStore(dist.PrefixStore("round", server), lambda: calls.append("declare"),
                       lambda seconds: calls.append(("barrier", seconds)))
    store.set("a", b"1")
    assert store.get("a") == b"1" and store.multi_get(["a"]) == [b"1"] and store.add("n", 2) == 2
    # torch 2.13's own barrier, as its agent calls it; it would wait 7 s for a second agent.
    store_util.barrier(store, world_size=2, key_prefix=EXIT_BARRIER_PREFIX, barrier_timeout=7)
    store_util.barrier(store, world_size=2, key_prefix=EXIT_BARRIER_PREFIX, barrier_timeout=7)
    assert calls == ["declare", ("barrier", 7.0), ("barrier", 7.0)]  # declared once
    assert server.get(f"round/{EXIT_BARRIER_PREFIX}/num_members") == b"2"  # the counter still counts


AGENT_RUN = textwrap.dedent('''
    import json, socket, sys
    from torch.distributed.elastic.rendezvous import registry
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    from elastic.rendezvous.torchrun_plugin import TorchrunRendezvousHandler
    from elastic.rendezvous.torchrun_outcome import leaving_after_success
    from elastic.rendezvous.api import Rendezvous, RendezvousInfo
    from elastic.rendezvous.records import Member

    calls = []
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    class Scripted(Rendezvous):
        run_id, node_id = "job", "node-a"
        def next_rendezvous(self):
            calls.append("next_rendezvous")
            return RendezvousInfo("job", 0, 0, 1, "127.0.0.1", port, (Member("node-a", "127.0.0.1", port),))
        def declare_finished(self):
            calls.append("declare_finished")
        def finish(self, timeout):
            calls.append("finish")
            return True
        def shutdown(self):
            calls.append(f"shutdown after success: {leaving_after_success()}")

    class Adapter(TorchrunRendezvousHandler):
        def get_backend(self):
            return "scripted"  # torch checks it against --rdzv-backend

    registry.handler_registry.register("scripted", lambda params: Adapter(Scripted(), "127.0.0.1"))
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, rdzv_backend="scripted", rdzv_endpoint="x:1",
                          run_id="job", max_restarts=0, monitor_interval=0.1)
    try:
        elastic_launch(config, sys.executable)("-c", f"raise SystemExit({sys.argv[1]})")
    except Exception as error:
        calls.append(type(error).__name__)
    print(json.dumps(calls))
''')


@pytest.mark.parametrize("worker_exit, expected", [
    (0, ["next_rendezvous", "declare_finished", "finish", "shutdown after success: True"]),
    (3, ["next_rendezvous", "shutdown after success: False", "ChildFailedError"]),
])
def test_torchs_agent_declares_the_end_only_after_its_workers_succeeded(tmp_path, worker_exit, expected):
    env = {**os.environ, "PYTHONPATH": REPO, "LOGLEVEL": "WARNING"}
    done = subprocess.run([sys.executable, "-c", AGENT_RUN, str(worker_exit)], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == expected


# -- real torchrun agents ------------------------------------------------------------------------
def torchrun(tmp_path, etcd_server, run_id: str, name: str, script: str, *args: str, conf: str = "") -> Launched:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"}
    command = [*torchrun_command(), "--rdzv-backend=etcd-v3", f"--rdzv-endpoint={etcd_endpoint(etcd_server)}",
               f"--rdzv-id={run_id}",
               f"--rdzv-conf={etcd_credentials(etcd_server)},lease_ttl=2,last_call_timeout=1{conf}",
               "--nnodes=1:2", "--nproc-per-node=1", "--max-restarts=1", "--monitor-interval=0.2", script, *args]
    return Launched(command, name=name, logdir=tmp_path, env=env, cwd=tmp_path, merge_output=True,
                    new_session=True, timeout=90)


@pytest.mark.slow
@pytest.mark.etcd
def test_a_torchrun_that_arrives_after_the_job_finished_exits_3_unless_told_it_is_fine(tmp_path, etcd_server):
    script = tmp_path / "work.py"
    script.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\ndist.barrier()\n")
    run_id = unique_run_id("finished")
    launched = []
    try:
        launched.append(first := torchrun(tmp_path, etcd_server, run_id, "first", str(script)))
        assert first.wait() == 0, logs(tmp_path)
        launched.append(late := torchrun(tmp_path, etcd_server, run_id, "late", str(script)))
        assert late.wait() == 3, logs(tmp_path)
        assert "before this node arrived; nothing to do, exit code 3" in late.stdout, late.stdout[-3000:]
        assert "Traceback" not in late.stdout, late.stdout[-3000:]
        launched.append(fine := torchrun(tmp_path, etcd_server, run_id, "fine", str(script),
                                         conf=",already_finished_ok=1"))
        assert fine.wait() == 0, logs(tmp_path)
        assert "before this node arrived; nothing to do (" in fine.stdout, fine.stdout[-3000:]
    finally:
        for agent in launched:
            agent.kill_tree()


@pytest.mark.slow
@pytest.mark.etcd
def test_a_torchrun_of_another_job_with_the_same_run_id_is_refused_in_one_line(tmp_path, etcd_server):
    hold = tmp_path / "hold.py"
    hold.write_text("import sys, time, torch.distributed as dist\ndist.init_process_group('gloo')\n"
                    "open(sys.argv[1], 'w').close()\ntime.sleep(60)\n")
    other = tmp_path / "other.py"
    other.write_text("print('job 2 ran')\n")
    run_id = unique_run_id("mismatch")
    job1 = torchrun(tmp_path, etcd_server, run_id, "job1", str(hold), str(tmp_path / "formed"))
    try:
        job1.exited_within(0.1, diagnose=False)
        deadline = 60
        while not (tmp_path / "formed").exists() and deadline > 0:
            assert job1.returncode is None, logs(tmp_path)
            job1.exited_within(0.5, diagnose=False)
            deadline -= 0.5
        job2 = torchrun(tmp_path, etcd_server, run_id, "job2", str(other), "--password", "hunter2")
        assert job2.wait() == 1, logs(tmp_path)
        refusal = [line for line in job2.stdout.splitlines() if "is refused" in line]
        assert len(refusal) == 1 and "hold.py" in refusal[0] and "other.py" in refusal[0], job2.stdout[-3000:]
        assert "hunter2" not in job2.stdout and "Traceback" not in job2.stdout
        assert "job 2 ran" not in job2.stdout
        assert job1.returncode is None  # job 1 was not disturbed
    finally:
        job1.kill_tree()
        if "job2" in locals():
            job2.kill_tree()
