"""The survivor's console when a node dies, and on Ctrl-C: the agent's line, not its workers' tracebacks.

Real agents on a real etcd, real gloo workers (``workers/allreduce.py``). When one node is
SIGKILLed, the survivor's worker fails at once with gloo's "Connection closed by peer" (or
"reset"), and on Ctrl-C (SIGINT to the agent, which forwards it) with a ``KeyboardInterrupt``:
those tracebacks go to the rank's ``stderr.log``, and the console says in one agent line which
node left. A traceback of the user's own (a ``ZeroDivisionError``) stays on the console.
"""

from __future__ import annotations

import re
import signal
import textwrap

import pytest

from e2e import allreduces_at, etcd_flags, loop_args, worker_alive, worker_pids

pytestmark = [pytest.mark.slow, pytest.mark.needs_torch]

PEER_NOISE = ("Traceback", "Connection closed by peer", "Connection reset by peer", "KeyboardInterrupt", "GLHF")


def node_id(stderr: str) -> str:
    """The node id an agent printed in its first ``formed a world`` line."""
    match = re.search(r"formed a world of \d+ workers? on \d+ nodes?; node (\S+) runs", stderr)
    assert match, stderr[-3000:]
    return match[1]


def attempt_stderr(log_dir, run_id: str, node: str, attempt: int) -> str:
    """What local rank 0's ``stderr.log`` of ``attempt`` holds ("" when there is none)."""
    path = log_dir / run_id / node / f"attempt_{attempt}" / "0" / "stderr.log"
    return path.read_text() if path.exists() else ""


def test_a_survivor_says_in_one_line_which_node_left_and_keeps_the_tracebacks_in_the_worker_logs(
        procs, reports, etcd_server, tmp_path):
    flags = ["--nnodes=1:2", "--nproc-per-node=1", "--max-restarts=0", *etcd_flags(etcd_server)]
    run_id = flags[flags.index("--rdzv-id") + 1]
    args = loop_args(reports, tmp_path / "stop")
    agents = [procs.elasticrun(*flags, f"--log-dir={tmp_path / f'logs{i}'}", *args, name=f"agent{i}") for i in range(2)]
    records = reports.wait_for("a world of 2", allreduces_at(2), agents)
    rank0_pid = next(r["pid"] for r in records if r["event"] == "started" and r["rank"] == 0)
    victim = next(a for a in agents if rank0_pid in {p.pid for p in a.tree()})
    survivor = agents[1 - agents.index(victim)]
    lost, kept = node_id(victim.stderr), node_id(survivor.stderr)
    killed_at = victim.kill_tree().at
    reports.wait_for("the survivor's world of 1", allreduces_at(1, after=killed_at, not_by=worker_pids(records)),
                     [survivor])

    survivor.send_signal(signal.SIGINT)  # Ctrl-C
    assert survivor.wait() == 128 + signal.SIGINT, survivor.describe()

    console = survivor.stderr + survivor.stdout
    assert not [word for word in PEER_NOISE if word in console], console
    naming = [line for line in console.splitlines() if lost in line and "nodes took part" not in line]
    assert len(naming) == 1 and "member lost" in naming[0], console  # the summary aside, one line
    kept_in = attempt_stderr(tmp_path / f"logs{agents.index(survivor)}", run_id, kept, 0)
    assert "Traceback" in kept_in and re.search(r"Connection (closed|reset) by peer|failed to recv", kept_in), kept_in
    # (A KeyboardInterrupt traceback of the second attempt's worker, if the SIGTERM that follows the
    # forwarded SIGINT let it print one, is in attempt_1/0/stderr.log.)
    assert [pid for pid in worker_pids(reports.all()) if worker_alive(pid)] == []
    assert survivor.tree() == [] and victim.tree() == []


ZERO_DIVISION = textwrap.dedent("""
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    for step in range(1000):
        dist.all_reduce(torch.ones(1))
        if dist.get_rank() == 1 and step == 3:
            1 / 0
""")


def test_the_users_own_traceback_stays_on_the_console_without_its_peers(procs, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(ZERO_DIVISION)
    agent = procs.elasticrun("--standalone", "--nproc-per-node=2", str(script))
    assert agent.wait() == 1, agent.describe()
    console = agent.stderr
    assert console.count("Traceback (most recent call last):") == 1, console
    assert re.search(r"^\[rank1\]: ZeroDivisionError: division by zero$", console, re.M), console
    assert "by peer" not in console and "GLHF" not in console, console
    assert agent.tree() == []
