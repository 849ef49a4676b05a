"""The fault-injection tools themselves: a real 3-member etcd, a single member, a namespace link."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import grpc
import pytest
from etcd3 import etcdrpc

pytestmark = [pytest.mark.chaos, pytest.mark.etcd]


def put(address: str, key: bytes, value: bytes, timeout: float = 5.0) -> None:
    with grpc.insecure_channel(address) as channel:
        etcdrpc.KVStub(channel).Put(etcdrpc.PutRequest(key=key, value=value), timeout=timeout)


def get(address: str, key: bytes, timeout: float = 5.0) -> bytes | None:
    with grpc.insecure_channel(address) as channel:
        found = etcdrpc.KVStub(channel).Range(etcdrpc.RangeRequest(key=key), timeout=timeout).kvs
    return found[0].value if found else None


def address(member) -> str:
    return f"127.0.0.1:{member.client_port}"


def test_a_killed_leader_is_replaced_and_rejoins_with_its_data(etcd_cluster_factory):
    cluster = etcd_cluster_factory(3)
    leader = cluster.leader()
    put(address(leader), b"/k", b"v1")
    cluster.kill(leader)
    assert not cluster.running(leader)
    successor = cluster.leader()
    assert successor != leader
    put(address(successor), b"/k", b"v2")
    cluster.start(leader)
    cluster.wait_healthy()
    assert get(address(leader), b"/k") == b"v2"


def test_a_paused_majority_leaves_no_leader_until_resumed(etcd_cluster_factory):
    from elastic.testing.etcd_server import EtcdServerError

    cluster = etcd_cluster_factory(3)
    leader = cluster.leader()
    left = next(member for member in cluster.members if member != leader)
    paused = [member for member in cluster.members if member != left]
    for member in paused:
        cluster.pause(member)
    with pytest.raises(EtcdServerError, match="no etcd leader"):
        cluster.leader(timeout=3)
    with pytest.raises(grpc.RpcError):
        put(address(left), b"/k", b"v", timeout=1.5)
    for member in paused:
        cluster.resume(member)
    cluster.leader(timeout=15)
    put(address(left), b"/k", b"v")


def test_a_single_member_restarts_on_its_port_with_its_keys(etcd_cluster_factory):
    cluster = etcd_cluster_factory(1)
    member = cluster.members[0]
    put(address(member), b"/k", b"kept")
    pid = cluster.pid(member)
    cluster.kill(member)
    with pytest.raises(grpc.RpcError):
        get(address(member), b"/k", timeout=1)
    cluster.start(member)
    assert cluster.pid(member) not in (None, pid)
    assert get(address(member), b"/k") == b"kept"


def test_closing_a_cluster_stops_every_member_by_pid_and_removes_its_data(etcd_cluster_factory):
    cluster = etcd_cluster_factory(3)
    cluster.pause(cluster.members[0])
    pids, workdir = cluster.pids(), cluster.workdir
    cluster.close()
    assert not any(_alive(pid) for pid in pids)
    assert not workdir.exists()


def test_a_cut_namespace_reaches_the_host_end_only_while_the_link_is_up(netns_link):
    with socket.socket() as server:
        server.bind((netns_link.host_addr, 0))
        server.listen()
        port = server.getsockname()[1]
        assert _connects_from_inside(netns_link, port)
        netns_link.cut()
        assert not _connects_from_inside(netns_link, port)
        with socket.create_connection((netns_link.host_addr, port), timeout=2):
            pass  # the host end keeps its address: host processes bound to it still meet
        netns_link.heal(probe_port=port)
        assert _connects_from_inside(netns_link, port)


def test_closing_a_namespace_link_deletes_the_namespace_and_the_pair():
    from support.netns import NamespaceLink

    link = NamespaceLink()
    link.close()
    link.close()
    assert link.name not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert subprocess.run(["ip", "link", "show", link.host_if], capture_output=True).returncode != 0


def _connects_from_inside(link, port: int) -> bool:
    code = (f"import socket\ntry:\n socket.create_connection(('{link.host_addr}', {port}), timeout=1).close()\n"
            f"except OSError:\n raise SystemExit(1)")
    return subprocess.run(link.command([sys.executable, "-c", code]), capture_output=True, timeout=20).returncode == 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][0] != "Z"
    except OSError:
        return False


def test_freeze_returns_once_every_thread_is_stopped_and_thaw_resumes_them():
    from support.freeze import freeze, thaw, thread_states

    code = "import threading, time\nfor _ in range(3): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\nprint(flush=True)\ntime.sleep(60)"
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        process.stdout.readline()  # the threads are started
        freeze(process.pid)
        assert thread_states(process.pid) == ["T"] * 4
        thaw(process.pid)
        for _ in range(100):
            if "T" not in thread_states(process.pid):
                break
            time.sleep(0.01)
        assert "T" not in thread_states(process.pid)
    finally:
        process.kill()
        process.wait()


def test_with_stacks_runs_a_module_as_main_and_dumps_its_threads_on_sigusr1(tmp_path):
    import os
    import signal

    from elastic.testing import with_stacks

    (tmp_path / "sleeper.py").write_text(
        "import sys, time\nif __name__ == '__main__':\n    print(sys.argv[1:], flush=True)\n    time.sleep(60)\n")
    process = subprocess.Popen([*with_stacks.command("sleeper"), "--flag", "x"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(tmp_path)})
    try:
        assert process.stdout.readline() == "['--flag', 'x']\n"
        process.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
    finally:
        process.kill()
        _, stderr = process.communicate()
    assert "Current thread 0x" in stderr or "Thread 0x" in stderr, stderr
    assert "sleeper.py" in stderr, stderr
