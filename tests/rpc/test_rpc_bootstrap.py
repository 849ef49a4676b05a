"""Starting and stopping RPC in real processes: shared port, restarts in-process, SIGTERM, failures."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from elastic.testing.ports import free_port

# Slow: each test starts workers that import torch (seconds each); CI runs them (--all).
pytestmark = [pytest.mark.slow, pytest.mark.needs_torch]


def test_rpc_and_a_gloo_process_group_share_master_port_and_rpc_starts_twice(spawn):
    results = spawn.run("with_process_group", 2)
    for rank, result in enumerate(results):
        first, second = result["first"], result["second"]
        assert first["name"] == second["name"] == f"worker{rank}"
        assert first["echo"] == 1.0 + rank  # torch.add(ones, our rank), run by the peer
        assert second["echo"] == 3.0
        assert result["all_reduce"] == 3.0  # the process group works between the two sessions
        assert result["started_after"] is False
        assert result["second_init_error"] == f"RPC is already started in this process as worker{rank}; shut it down first."
        assert "/etcd-elastic%2Frpc%2Frpc-" in first["init_method"] and first["init_method"].endswith("agent_store=0")


def test_sigterm_exits_143_at_once_even_while_waiting_in_an_rpc(spawn):
    """Rank 0 waits in a 120 s ``rpc_sync``; rank 1 serves it and waits in its graceful shutdown.

    A Python-level handler alone would run only when the RPC returns (measured: it waits for it),
    so each would exit after minutes. The wakeup-fd watcher exits within the SIGTERM bound.
    """
    run = spawn("blocked", 2)
    ready = [run.out_dir / "ready-0", run.out_dir / "ready-1", run.out_dir / "served-1"]
    run.wait_for("the files " + ", ".join(path.name for path in ready), lambda: all(path.exists() for path in ready))
    time.sleep(0.5)  # let rank 0 enter the blocking call
    for rank in (0, 1):
        sent = time.monotonic()
        run.ranks[rank].send_signal(signal.SIGTERM)
        code = run.ranks[rank].exited_within(30)
        if code is None:
            raise AssertionError(f"rank {rank} ignored SIGTERM for 30s:\n{run.log(rank)}\n{run.ranks[rank].hang}")
        assert code == 143, run.log(rank)
        assert time.monotonic() - sent < 30
        assert "SIGTERM; shutting RPC down without waiting for peers" in run.log(rank)


def test_a_missing_peer_fails_the_start_naming_the_worker_and_the_store(worker_environ, tmp_path):
    port = free_port()
    env = worker_environ(1, 2, port)  # rank 1 of 2; nobody hosts the store
    code = textwrap.dedent("""
        import rpc
        try:
            rpc.start(init_timeout=1, rpc_timeout=5).__enter__()
        except rpc.RpcInitError as error:
            print(error)
            print("cause:", type(error.__cause__).__name__)
    """)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    expected = (f"Worker worker1 (rank 1 of 2, run rpc-test, restart 0) could not join the RPC group "
                f"through 127.0.0.1:{port}")
    assert expected in result.stdout
    assert "timed out" in result.stdout and "frame #" not in result.stdout.splitlines()[0]
    assert "cause: DistNetworkError" in result.stdout  # torch's own error, chained
