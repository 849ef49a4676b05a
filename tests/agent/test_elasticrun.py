"""``elasticrun`` end to end: real agents, real gloo workers, real etcd and built-in stores.

Every agent is ``python -m elastic.run`` in its own process on loopback; the workers (in
``tests/agent/workers/``) append JSON lines with their ranks, restart count and wall times to a
file the test reads. Each test uses its own run id; every process it starts (agents, their
workers, a store) is stopped by PID at the end, whatever happened (the ``procs`` fixture).

The helpers are ``e2e.py``, on :mod:`elastic.testing.agents`. Rendezvous settings are shrunk
to keep the file fast: ``lease_ttl=2,last_call_timeout=1``. With ``ELASTIC_TEST_PREWARM=1``
every agent runs with ``--prewarm`` (workers forked from pre-warmed templates): the file must
pass both ways.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import time
import urllib.request
import uuid

import psutil
import pytest

from e2e import (
    FAST_CONF,
    LAST_CALL,
    LEASE_TTL,
    PREWARM,
    RUN_TIMEOUT,
    Processes,
    allreduces_at,
    assert_correct_allreduces,
    etcd_flags,
    loop_args,
    run_id,
    script,
    worker_alive,
)
from elastic.testing.agents import Launched, Reports, clean_env, read_json_lines, wait_until
from elastic.testing.ports import free_port

pytestmark = pytest.mark.slow


# -- rendezvous backends -----------------------------------------------------------------------


@pytest.fixture(params=[pytest.param("etcd", marks=pytest.mark.etcd), "tcp", "c10d"])
def rdzv_flags(request, tmp_path, procs) -> list[str]:
    """``--rdzv-*`` flags for a multi-node run on etcd, a separately run built-in store, or c10d."""
    if request.param == "etcd":
        return etcd_flags(request.getfixturevalue("etcd_server"))
    port = free_port()
    if request.param == "tcp":
        token_file = tmp_path / "store.token"
        token_file.write_text(uuid.uuid4().hex)
        procs.tcp_store(port, token_file)
        conf = f"{FAST_CONF},token_file={token_file}"
    else:
        conf = FAST_CONF
    return ["--rdzv-backend", request.param, "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id(),
            "--rdzv-conf", conf, "--local-addr", "127.0.0.1"]



# -- 1, 2: all-reduce --------------------------------------------------------------------------


@pytest.mark.needs_torch
def test_one_node_two_workers_all_reduce_the_right_sum(procs, reports):
    agent = procs.elasticrun("--standalone", "--nproc-per-node=2", script("allreduce.py"), str(reports.path))
    assert agent.wait() == 0, agent.stderr
    records = reports.all()
    assert_correct_allreduces(records, world=2)
    assert {(r["rank"], r["local_rank"]) for r in reports.events("allreduce")} == {(0, 0), (1, 1)}


@pytest.mark.needs_torch
def test_two_agents_form_a_world_of_four_with_unique_ranks(procs, reports, rdzv_flags):
    agents = [procs.elasticrun("--nnodes=2", "--nproc-per-node=2", *rdzv_flags, script("allreduce.py"),
                               str(reports.path)) for _ in range(2)]
    codes = [agent.wait() for agent in agents]
    assert codes == [0, 0], [agent.stderr[-3000:] for agent in agents]
    records = reports.all()
    assert_correct_allreduces(records, world=4)
    done = reports.events("allreduce")
    assert len(done) == 4 and len({r["rank"] for r in done}) == 4
    assert {r["group_rank"] for r in done} == {0, 1}
    assert len({r["pid"] for r in done}) == 4
    assert len({r["master"] for r in done}) == 1 and done[0]["master"].startswith("127.0.0.1:")


@pytest.mark.needs_torch
def test_an_agent_arriving_after_the_job_finished_exits_3_with_nothing_to_do(procs, reports, etcd_server):
    flags = etcd_flags(etcd_server)
    first = procs.elasticrun("--nnodes=1", "--nproc-per-node=1", *flags, script("allreduce.py"), str(reports.path))
    assert first.wait() == 0, first.stderr
    late = procs.elasticrun("--nnodes=1", "--nproc-per-node=1", *flags, script("allreduce.py"), str(reports.path))
    assert late.wait() == 3, late.stderr  # a reused run id must not pass for a run
    assert "the job finished" in late.stderr and "nothing to do" in late.stderr
    assert len(reports.events("allreduce")) == 1  # the late agent started no worker


# -- 3, 4: worker failures ---------------------------------------------------------------------


@pytest.mark.needs_torch
def test_a_worker_that_crashes_once_is_restarted_with_restart_count_1(procs, reports):
    agent = procs.elasticrun("--standalone", "--nproc-per-node=2", "--max-restarts=1",
                             script("crash_once.py"), str(reports.path))
    assert agent.wait() == 0, agent.stderr
    assert [r["restart_count"] for r in reports.events("crash")] == [0]
    assert {r["restart_count"] for r in reports.events("allreduce")} == {1}
    assert_correct_allreduces(reports.all(), world=2)
    # (Local rank 0 of the first attempt may be stopped before it reports; the second attempt is whole.)
    assert {r["local_rank"] for r in reports.events("started", restart_count=1)} == {0, 1}
    assert "restart 1 of 1" in agent.stderr


@pytest.mark.needs_torch
def test_exhausted_restarts_exit_non_zero_with_the_root_cause(procs, reports):
    agent = procs.elasticrun("--standalone", "--nproc-per-node=2", "--max-restarts=1",
                             script("always_fail.py"), str(reports.path))
    code = agent.wait()
    err = agent.stderr
    assert code != 0, err
    assert {r["restart_count"] for r in reports.events("started")} == {0, 1}  # two attempts, then give up
    summary = err[err.index("Root cause"):]
    rank = int(re.search(r"rank\s+: (\d) \(local_rank \d\)", summary)[1])
    assert f"always_fail: rank {rank} gives up" in summary
    assert f"host       : {socket.gethostname()}" in summary
    assert "exit       : exit code 1" in summary
    assert "Traceback (most recent call last)" in summary and "deliberately_failing_step" in summary
    assert "ValueError" in summary
    *_, reason, run_summary = err.splitlines()
    assert re.search(r"^elasticrun: default FAILED on \S+: [12] worker\(s\) failed$", reason), err
    assert re.fullmatch(r"elasticrun: run [0-9a-f]{8} node \S+: failed after [\d.]+s; 2 attempts, "
                        r"1 restart \(1 worker failure\)", run_summary), err


# -- 5, 6: membership changes ------------------------------------------------------------------


@pytest.mark.parametrize("max_restarts", [3, 0])
@pytest.mark.needs_torch
def test_killing_a_node_restarts_the_survivors_within_the_lease_ttl(procs, reports, etcd_server, tmp_path,
                                                                     max_restarts, record_property):
    """The headline promise: survivors do not wait for a collective timeout, at most for the lease.

    Their workers fail first (the dead peer's connections reset). With restarts left the agents
    restart their workers at once, within TTL + 2 s of the kill (the new world's first
    all-reduce follows after a torch import and gloo init). With none left they must wait for
    the lease to tell a dead peer from a bug of their own: TTL + last call + 3 s. Either way
    the restart is a membership change and costs no restart.
    """
    stop_file = tmp_path / "stop"
    flags = ["--nnodes=2:3", "--nproc-per-node=1", f"--max-restarts={max_restarts}", *etcd_flags(etcd_server)]
    agents = [procs.elasticrun(*flags, *loop_args(reports, stop_file)) for _ in range(3)]
    records = reports.wait_for("a world of 3", allreduces_at(3), agents)

    rank0_pid = next(r["pid"] for r in records if r["event"] == "started" and r["rank"] == 0 and r["world_size"] == 3)
    victim = next(a for a in agents if rank0_pid in {p.pid for p in a.tree()})
    survivors = [a for a in agents if a is not victim]
    killed_at = victim.kill_tree().at

    records = reports.wait_for("a world of 2 after the kill", allreduces_at(2, after=killed_at), survivors)
    first = min(r["time"] for r in records
                if r["event"] == "allreduce" and r["world_size"] == 2 and r["time"] > killed_at)
    recovery = first - killed_at
    started = min(r["time"] for r in records if r["event"] == "started" and r["world_size"] == 2) - killed_at
    record_property("recovery_s", round(recovery, 3))
    print(f"max_restarts={max_restarts}: new workers started {started:.2f}s and all-reduced {recovery:.2f}s "
          f"after the kill")
    stop_file.touch()
    codes = [agent.wait() for agent in survivors]
    assert codes == [0, 0], [agent.stderr[-3000:] for agent in survivors]
    # The agents' promise is the restart: new workers of the smaller world running within the
    # bound (stamped before they import torch). Their first all-reduce also needs a torch import
    # and a gloo init (1.3-2.5 s here), measured side by side with torchrun in benchmarks/recovery.py.
    bound = LEASE_TTL + 2.0 if max_restarts else LEASE_TTL + LAST_CALL + 3.0
    assert started <= bound, (f"the survivors took {started:.2f}s to restart their workers (bound {bound:g}s); "
                              f"they all-reduced again {recovery:.2f}s after the kill")
    assert recovery <= bound + 10.0, f"the new world took {recovery:.2f}s to all-reduce"
    new_world = [r for r in reports.events("allreduce") if r["world_size"] == 2]
    assert {r["result"] for r in new_world} == {3}
    # A peer's death is a membership change, not a failure of the survivors' workers.
    assert {r["restart_count"] for r in new_world} == {0}


@pytest.mark.needs_torch
def test_a_third_agent_joining_grows_the_world_to_three(procs, reports, etcd_server, tmp_path):
    stop_file = tmp_path / "stop"
    flags = ["--nnodes=2:3", "--nproc-per-node=1", "--max-restarts=0", *etcd_flags(etcd_server)]
    agents = [procs.elasticrun(*flags, *loop_args(reports, stop_file)) for _ in range(2)]
    reports.wait_for("a world of 2", allreduces_at(2), agents)

    joined_at = time.time()
    agents.append(procs.elasticrun(*flags, *loop_args(reports, stop_file)))
    reports.wait_for("a world of 3", allreduces_at(3, after=joined_at), agents)
    stop_file.touch()
    codes = [agent.wait() for agent in agents]
    assert codes == [0, 0, 0], [agent.stderr[-3000:] for agent in agents]
    grown = [r for r in reports.events("allreduce") if r["world_size"] == 3]
    assert {r["result"] for r in grown} == {6}
    assert {r["restart_count"] for r in grown} == {0}  # with --max-restarts=0: growing is free
    # The two first agents' workers were restarted: each rank 0..2 started in the world of 3.
    assert {r["rank"] for r in reports.events("started", world_size=3)} == {0, 1, 2}


@pytest.mark.needs_torch
def test_a_prewarmed_node_joins_a_running_job_only_once_its_templates_are_ready(procs, reports, etcd_server,
                                                                                 tmp_path):
    # Its join stops the running workers; joining while its templates still import would leave
    # the job idle for that import. A module that takes 4 s to import stands for torch.
    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(4)\n")
    stop_file = tmp_path / "stop"
    flags = ["--nnodes=2:3", "--nproc-per-node=1", "--max-restarts=0", *etcd_flags(etcd_server)]
    agents = [procs.elasticrun(*flags, *loop_args(reports, stop_file)) for _ in range(2)]
    reports.wait_for("a world of 2", allreduces_at(2), agents)

    started = time.time()
    env = clean_env(TMPDIR=str(tmp_path), PYTHONPATH=str(tmp_path))
    agents.append(procs.elasticrun("-v", "--prewarm", "--prewarm-modules=slow_import", *flags,
                                   *loop_args(reports, stop_file), env=env))
    records = reports.wait_for("a world of 3", allreduces_at(3, after=started), agents)
    still_two = [r["time"] for r in records if r["event"] == "allreduce" and r["world_size"] == 2]
    assert max(still_two) > started + 3.5, "the job stopped before the new node's templates were ready"
    stop_file.touch()
    codes = [agent.wait() for agent in agents]
    assert codes == [0, 0, 0], [agent.stderr[-3000:] for agent in agents]
    assert "joins the running job after its worker templates are ready" in agents[2].stderr  # an INFO line: -v


# -- 7, 8: signals and observability -----------------------------------------------------------


@pytest.mark.needs_torch
def test_sigterm_stops_the_agent_with_143_and_leaves_no_worker(procs, reports, tmp_path):
    events = tmp_path / "events.jsonl"
    agent = procs.elasticrun("--standalone", "--nproc-per-node=2", f"--event-log={events}",
                             *loop_args(reports, tmp_path / "stop"))
    records = reports.wait_for("the workers' first all-reduce", allreduces_at(2), [agent])
    worker_pids = {r["pid"] for r in records if r["event"] == "started"}
    assert len(worker_pids) == 2 and all(worker_alive(pid) for pid in worker_pids)

    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 143, agent.stderr
    assert [pid for pid in worker_pids if worker_alive(pid)] == []
    assert re.search(r"node \S+: received SIGTERM; stopping the workers$", agent.stderr, re.M), agent.stderr
    assert read_json_lines(events)[-1]["event"] == "job_finished"
    assert read_json_lines(events)[-1]["status"] == "signalled:SIGTERM"
    assert re.search(r"^elasticrun: run \S+ node \S+: stopped by SIGTERM after [\d.]+s; 1 attempt, no restarts$",
                     agent.stderr, re.M), agent.stderr


@pytest.mark.needs_torch
def test_metrics_and_event_log_during_a_run(procs, reports, tmp_path):
    port, events_path, stop_file = free_port(), tmp_path / "events.jsonl", tmp_path / "stop"
    agent = procs.elasticrun("--standalone", "--nproc-per-node=2", f"--metrics-port={port}",
                             f"--event-log={events_path}", *loop_args(reports, stop_file))
    reports.wait_for("the workers' first all-reduce", allreduces_at(2), [agent])

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as health:
        assert health.status == 200
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as metrics:
        text = metrics.read().decode()
    rounds = re.search(r"^elastic_rendezvous_rounds_total(\{[^}]*\})? ([0-9.e+]+)$", text, re.M)
    assert rounds is not None, text
    assert float(rounds[2]) == 1.0

    stop_file.touch()
    assert agent.wait() == 0, agent.stderr
    events = [json.loads(line) for line in events_path.read_text().splitlines()]
    names = [event["event"] for event in events]
    assert "round_joined" in names and names[-1] == "job_finished"
    joined = events[names.index("round_joined")]
    assert joined["group_world_size"] == 1 and joined["round"] == 0
    assert events[-1]["status"] == "succeeded"
    # Events and every metric name the node by its id (the metrics' node label), and the host apart.
    assert {(event["node"], event["host"]) for event in events} == {(joined["members"][0], socket.gethostname())}
    assert rounds[1] == f'{{node="{joined["node"]}",run_id="{joined["run_id"]}"}}', rounds[0]


def test_one_of_two_nodes_says_what_it_waits_for_until_its_join_timeout(procs, reports, etcd_server):
    """Progress while waiting: a line after 2 s and every 10 s, /healthz and a gauge with the
    counts, and a timeout error that names them."""
    port, join_timeout = free_port(), 13
    flags = etcd_flags(etcd_server)
    conf = flags.index("--rdzv-conf") + 1
    flags[conf] += f",join_timeout={join_timeout}"
    agent = procs.elasticrun("--nnodes=2", "--nproc-per-node=1", f"--metrics-port={port}", *flags,
                             script("allreduce.py"), str(reports.path))
    procs.wait_for("the agent's 'waiting for nodes' line", lambda: "waiting for nodes" in agent.stderr,
                   names=[agent.name])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as health:
        assert json.loads(health.read()) == {"status": "ok", "reason": "waiting for rendezvous (1 of 2)"}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as metrics:
        text = metrics.read().decode()
    assert re.search(r"^elastic_rendezvous_joined_nodes\{[^}]*\} 1\.0$", text, re.M), text

    assert agent.wait() == 1, agent.stderr
    lines = [line for line in agent.stderr.splitlines() if "waiting for nodes" in line]
    assert len(lines) == 2, agent.stderr  # after the 2 s grace, then 10 s later
    assert re.search(r"round 0 \(node \S+\): waiting for nodes: 1 of 2 nodes joined; 1[01] s left before the join timeout$",
                     lines[0]), lines
    *_, error_line, run_summary = agent.stderr.splitlines()
    assert f"within the join timeout ({join_timeout}s); need at least 2 nodes (last seen: 1 of 2 joined)" in error_line
    assert re.search(r"failed in the rendezvous after [\d.]+s; 0 attempts, no restarts$", run_summary), run_summary
    assert reports.all() == []


# -- 9: the worker environment against torchrun's ---------------------------------------------


# Values that differ per run or per launcher, compared by form instead.
BY_FORM = {
    "MASTER_PORT": r"[1-9][0-9]{0,4}",
    "TORCHELASTIC_RUN_ID": r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    "TORCHELASTIC_ERROR_FILE": r"/.+/attempt_0/LOCAL_RANK/error\.json",
    # torchrun's agent hosts a TCPStore for the workers ("True"); ours imports no torch and hosts
    # none, so rank 0 hosts it and the value must be "False" (checked below).
    "TORCHELASTIC_USE_AGENT_STORE": r"True|False",
}


@pytest.mark.needs_torch
def test_worker_environment_equals_torchruns_key_by_key(procs, tmp_path):
    dumps = {}
    for launcher in ("torchrun", "elasticrun"):
        out = tmp_path / launcher
        out.mkdir()
        start = procs.torchrun if launcher == "torchrun" else procs.elasticrun
        run = start("--standalone", "--nproc-per-node=2", script("dump_env.py"), str(out), name=launcher)
        assert run.wait() == 0, run.stderr
        dumps[launcher] = {rank: json.loads((out / f"env_{rank}.json").read_text()) for rank in (0, 1)}

    for local_rank in (0, 1):
        theirs, ours = dumps["torchrun"][local_rank], dumps["elasticrun"][local_rank]
        if PREWARM:  # a forked worker's /proc/<pid>/cmdline is its template's (docs/internals.md: --prewarm)
            assert ours["cmdline"][:3] == theirs["cmdline"][:2] + ["-c"]
            assert "elastic.agent.prewarm.template" in ours["cmdline"][3]
        else:
            assert ours["cmdline"] == theirs["cmdline"][:3] + [str(tmp_path / "elasticrun")]
        theirs_env, ours_env = theirs["env"], ours["env"]
        assert set(ours_env) == set(theirs_env), set(ours_env) ^ set(theirs_env)
        for key, form in BY_FORM.items():
            pattern = form.replace("LOCAL_RANK", str(local_rank))
            assert re.fullmatch(pattern, theirs_env[key]), (key, theirs_env[key])
            assert re.fullmatch(pattern, ours_env[key]), (key, ours_env[key])
        # Both agents host the workers' store (ours in its store helper, on the pre-bound port).
        assert (ours_env["TORCHELASTIC_USE_AGENT_STORE"], theirs_env["TORCHELASTIC_USE_AGENT_STORE"]) == ("True", "True")
        different = {key for key in theirs_env if key not in BY_FORM and ours_env[key] != theirs_env[key]}
        assert different == set(), {key: (ours_env[key], theirs_env[key]) for key in different}


# -- 10: no orphans, whatever kills the agent --------------------------------------------------


def start_times(pids: list[int]) -> dict[int, float]:
    """pid → start time, to tell our processes from later ones that reuse a pid."""
    return {pid: psutil.Process(pid).create_time() for pid in pids}


def still_running(started: dict[int, float]) -> list[int]:
    """The processes of ``started`` that still run (a zombie does not)."""
    left = []
    for pid, start in started.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == start and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
        except psutil.Error:
            pass
    return sorted(left)


def wait_gone(started: dict[int, float], timeout: float) -> list[int]:
    """Poll until none of ``started`` runs or ``timeout`` passes; the survivors."""
    deadline = time.monotonic() + timeout
    while (left := still_running(started)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return left


def grandchildren_started(procs: Processes, reports: Reports, launched: Launched, workers: int) -> dict[int, float]:
    """Wait for ``workers`` grandchildren.py workers to report; every worker and grandchild pid."""
    records = reports.wait_for(f"{workers} workers with grandchildren",
                               lambda rs: len([r for r in rs if r["event"] == "grandchildren"]) == workers, [launched])
    pids = [pid for r in records if r["event"] == "grandchildren" for pid in [r["pid"], *r["children"]]]
    procs.worker_pids.update(pids)
    started = start_times(pids)
    assert len(started) == 3 * workers and still_running(started) == sorted(started)
    return started


def lifeline_watchdog(launched: Launched) -> psutil.Process:
    # python -c <isolated program importing elastic.agent.lifeline.watchdog> <pid file>
    [watchdog] = [p for p in launched.tree() if any("lifeline.watchdog" in part for part in p.cmdline())]
    return watchdog


@pytest.mark.needs_torch
def test_sigkill_of_the_agent_kills_its_workers_and_their_grandchildren_within_1s(procs, reports):
    agent = procs.elasticrun("--standalone", "--nproc-per-node=2", script("grandchildren.py"), str(reports.path))
    started = grandchildren_started(procs, reports, agent, workers=2)
    watchdog = lifeline_watchdog(agent)

    agent.proc.kill()  # as the OOM killer: the agent alone, no chance to run any code
    survivors = wait_gone(started, timeout=1.0)
    assert survivors == [], f"alive 1 s after the agent's SIGKILL: {survivors}"
    watchdog.wait(timeout=10)  # the watchdog leaves too
    agent.proc.wait(timeout=10)
    # The workers died of their parent-death signal; the watchdog killed the grandchildren.
    assert "elasticrun watchdog: agent" in agent.stderr


@pytest.mark.needs_torch
def test_stock_torchrun_leaves_its_worker_and_grandchildren_running_when_killed(procs, reports):
    """What docs/failure-behaviour.md says of torchrun (and so of our torchrun plugin)."""
    torchrun = procs.torchrun("--standalone", "--nproc-per-node=1", script("grandchildren.py"), str(reports.path))
    started = grandchildren_started(procs, reports, torchrun, workers=1)
    torchrun.proc.kill()
    torchrun.proc.wait(timeout=10)
    time.sleep(1.0)
    assert still_running(started) == sorted(started)  # orphans, until a test's cleanup kills them


@pytest.mark.needs_torch
def test_a_restarted_agent_stops_what_its_dead_predecessor_left_before_starting_workers(procs, reports, tmp_path):
    port, token_file = free_port(), tmp_path / "store.token"
    token_file.write_text(uuid.uuid4().hex)
    procs.tcp_store(port, token_file)  # (--standalone would give each agent a new run id)
    flags = ["--nnodes=1", "--rdzv-backend=tcp", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id()}",
             f"--rdzv-conf={FAST_CONF},token_file={token_file}", "--local-addr=127.0.0.1",
             f"--log-dir={tmp_path / 'logs'}", "--nproc-per-node=1", script("grandchildren.py"), str(reports.path)]
    first = procs.elasticrun(*flags, name="first")
    started = grandchildren_started(procs, reports, first, workers=1)
    [worker] = [r["pid"] for r in reports.events("grandchildren")]
    # The agent and its watchdog die together (one SIGKILL each, watchdog first): only the
    # parent-death signal acts, so the worker dies and its grandchildren are left in its session.
    lifeline_watchdog(first).kill()
    first.proc.kill()
    first.proc.wait(timeout=10)
    assert wait_gone({worker: started[worker]}, timeout=1.0) == []
    left = {pid: start for pid, start in started.items() if pid != worker}
    assert still_running(left) == sorted(left)

    second = procs.elasticrun(*flags, name="second")
    reports.wait_for("the second agent's worker", lambda rs: len([r for r in rs if r["event"] == "grandchildren"]) == 2,
                     [second])
    assert still_running(left) == []
    stderr = second.stderr
    notices = [line for line in stderr.splitlines() if "left by an earlier agent" in line]
    assert len(notices) == 1 and f"(pid {first.pid})" in notices[0], stderr
    assert stderr.index("left by an earlier agent") < stderr.index("formed a world of 1 worker")
    second.proc.send_signal(signal.SIGTERM)
    assert second.wait(timeout=30) == 143, second.stderr


def healthz_reason(port: int) -> str:
    """The ``reason`` of the agent's /healthz answer."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as health:
        return json.loads(health.read())["reason"]


@pytest.mark.needs_torch
def test_an_etcd_outage_keeps_the_workers_training_and_shows_in_healthz_and_metrics(procs, reports, tmp_path):
    """Static stability seen from outside: etcd down for 3 lease TTLs (stopped, then started on its
    data), the workers all-reduce on, /healthz stays 200 and names the outage, the gauge counts
    it, and nothing restarts: etcd extends every lease when it starts (a frozen single member
    would instead expire them as it wakes: the chaos suite's leader-pause row)."""
    from elastic.testing.etcd_server import EtcdServerOptions, start_etcd_server

    port, stop_file = free_port(), tmp_path / "stop"
    with start_etcd_server(EtcdServerOptions()) as server:
        agent = procs.elasticrun("--nnodes=1", "--nproc-per-node=2", f"--metrics-port={port}", "--max-restarts=0",
                                 "--rdzv-backend", "etcd", "--rdzv-endpoint", server.endpoints, "--rdzv-id", run_id(),
                                 "--rdzv-conf", FAST_CONF, "--local-addr", "127.0.0.1", *loop_args(reports, stop_file))
        reports.wait_for("the workers' first all-reduce", allreduces_at(2), [agent])
        stopped_at = time.time()
        server.stop()
        try:
            deadline = time.monotonic() + 3 * LEASE_TTL
            reason = ""
            while time.monotonic() < deadline:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as health:
                    assert health.status == 200
                    reason = json.loads(health.read())["reason"]
                time.sleep(0.2)
            assert re.fullmatch(r"running; store unreachable for [1-9][0-9]*s", reason), reason
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as metrics:
                gauge = re.search(r"^elastic_store_outage_seconds\{[^}]*\} ([0-9.e+]+)$", metrics.read().decode(), re.M)
            assert gauge is not None and float(gauge[1]) >= LEASE_TTL, gauge
            reports.wait_for("all-reduces during the outage", allreduces_at(2, after=stopped_at + 2 * LEASE_TTL), [agent])
        finally:
            server.start()
        assert wait_until(lambda: healthz_reason(port) == "running", RUN_TIMEOUT, "/healthz to say 'running' again",
                          interval=0.2)
        stop_file.touch()
        assert agent.wait() == 0, agent.stderr
    assert "the store has not answered a keepalive" in agent.stderr
    assert {r["restart_count"] for r in reports.events("allreduce")} == {0}
    assert len({r["pid"] for r in reports.events("started")}) == 2, agent.stderr  # the same two workers throughout


def test_a_worker_failure_during_an_etcd_outage_is_not_charged(procs, reports, tmp_path):
    """With --max-restarts=0, a worker that fails while etcd is down is restarted, uncharged,
    once etcd is back (the rejoin waits for it), and the job finishes."""
    from elastic.testing.etcd_server import EtcdServerOptions, start_etcd_server

    port, trigger = free_port(), tmp_path / "fail"
    with start_etcd_server(EtcdServerOptions()) as server:
        agent = procs.elasticrun("--nnodes=1", "--nproc-per-node=1", f"--metrics-port={port}", "--max-restarts=0",
                                 "--rdzv-backend", "etcd", "--rdzv-endpoint", server.endpoints, "--rdzv-id", run_id(),
                                 "--rdzv-conf", FAST_CONF, "--local-addr", "127.0.0.1",
                                 script("fail_on_file.py"), str(reports.path), str(trigger))
        reports.wait_for("the worker", lambda records: len(records) >= 1, [agent])
        server.stop()
        try:
            procs.wait_for("/healthz to name the outage", lambda: "store unreachable" in healthz_reason(port),
                           names=[agent.name])
            trigger.touch()
            reports.wait_for("the crash", lambda records: any(r["event"] == "crash" for r in records), [agent])
            time.sleep(1.0)  # the agent restarts and waits in the rejoin for etcd
        finally:
            server.start()
        assert agent.wait() == 0, agent.stderr
    assert [r["event"] for r in reports.all()] == ["started", "crash", "started", "finished"]
    assert "workers failed while the store did not answer" in agent.stderr
