"""The scripts the chart's pods run (charts/etcd-elastic/files/), run here for real.

* run-elasticrun.sh (the worker container's entry) under /bin/sh with a stand-in elasticrun;
* wait_for_etcd.py (the workers' init container) and etcd_auth_setup.py (the auth hook Job)
  against a real etcd (the local binary, on free loopback ports; these tests fail, never skip,
  without one; see elastic.testing.etcd_server.find_etcd_binary).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chartlib import CHART, REPO
from elastic.testing.agents import wait_until
from elastic.testing.ports import free_port

FILES = CHART / "files"
WRAPPER = FILES / "run-elasticrun.sh"
USER = "elastic"


# -- the worker container's entry wrapper --------------------------------------------------------
def fake_elasticrun(tmp_path: Path, body: str) -> dict[str, str]:
    """An environment whose PATH starts with a stand-in ``elasticrun`` running ``body`` (sh)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "elasticrun"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "MARK": str(tmp_path / "mark")}


def start_wrapper(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """The wrapper with its output in $MARK.out (a file: a pipe would hide a leftover child)."""
    with open(env["MARK"] + ".out", "w") as output:
        return subprocess.Popen(["/bin/sh", str(WRAPPER), *args], env=env, stdout=output,
                                stderr=subprocess.STDOUT, text=True)


def output_of(env: dict[str, str]) -> str:
    return Path(env["MARK"] + ".out").read_text()


def children_of(pid: int) -> list[int]:
    """Live child processes of ``pid`` (from /proc/*/stat: field 4 is the parent)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            children.append(int(stat.parent.name))
    return children


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


def test_wrapper_passes_every_argument_and_idles_after_success(tmp_path):
    env = fake_elasticrun(tmp_path, 'printf "%s\\n" "$@" > "$MARK"; exit 0')
    process = start_wrapper(env, "--nnodes=2:4", "--", "train.py", "two words", "")
    try:
        wait_until(lambda: "elasticrun finished with status 0" in output_of(env), 10, "the wrapper's 'finished' line")
        wait_until(lambda: len(children_of(process.pid)) == 1, 10, "the wrapper's one idle child")
        [sleeper] = children_of(process.pid)
        time.sleep(0.3)
        assert process.poll() is None, "a finished job must idle, not exit (the StatefulSet would restart it)"
        assert (tmp_path / "mark").read_text().split("\n")[:-1] == ["--nnodes=2:4", "--", "train.py", "two words", ""]
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=5) == 0
        assert time.monotonic() - started < 3, "the idle wrapper must exit promptly on SIGTERM"
        wait_until(lambda: gone(sleeper), 5, f"the idle child {sleeper} to exit")
    finally:
        stop(process)


def test_wrapper_exits_with_elasticruns_failure_status(tmp_path):
    process = start_wrapper(fake_elasticrun(tmp_path, "exit 3"))
    try:
        assert process.wait(timeout=5) == 3
        assert "finished" not in output_of({"MARK": str(tmp_path / "mark")})
    finally:
        stop(process)


def test_wrapper_forwards_sigterm_to_elasticrun_and_exits_with_its_status(tmp_path):
    body = ('trap \'echo stopped > "$MARK"; exit 143\' TERM\n'
            'echo running > "$MARK"\n'
            'while :; do sleep 0.05; done')
    process = start_wrapper(fake_elasticrun(tmp_path, body))
    mark = tmp_path / "mark"
    try:
        wait_until(lambda: mark.exists() and mark.read_text().strip() == "running", 10, "the fake elasticrun to run")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=5) == 143
        assert mark.read_text().strip() == "stopped", "elasticrun did not get the SIGTERM"
    finally:
        stop(process)


# -- wait_for_etcd.py and etcd_auth_setup.py against a real etcd -------------------------------
def run_script(name: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(FILES / name), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def start_etcd(**options):
    from elastic.testing.etcd_server import BinaryEtcdServer, EtcdServerOptions

    return BinaryEtcdServer(EtcdServerOptions(**options))


@pytest.fixture
def etcd():
    """A fresh etcd without auth (each test may turn auth on)."""
    server = start_etcd()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def passwords(tmp_path):
    root, user = tmp_path / "root-password", tmp_path / "password"
    root.write_text("r00t-secret\n")
    user.write_text("job-secret\n")
    return root, user


def setup_auth(endpoint: str, passwords, *extra: str) -> subprocess.CompletedProcess[str]:
    root, user = passwords
    return run_script("etcd_auth_setup.py", f"--endpoint={endpoint}", f"--user={USER}",
                      f"--password-file={user}", f"--root-password-file={root}", "--timeout=20", *extra)


def join_one_node_round(endpoint: str, conf: str) -> int:
    """Run one real rendezvous round (1 node) with ``conf`` as --rdzv-conf, as an agent would:
    lease, join key, close, watch. Returns the round's world size."""
    from elastic.rendezvous.backend_spec import spec_from_conf
    from elastic.rendezvous.conf import parse_rdzv_conf
    from elastic.rendezvous.registry import create_handler
    from elastic.rendezvous.settings import settings_from_conf

    parsed = parse_rdzv_conf(f"last_call_timeout=1,join_timeout=20,{conf}")
    settings = settings_from_conf(f"chart-{os.getpid()}-{time.monotonic_ns()}", 1, 1, parsed)
    handler = create_handler(spec_from_conf("etcd", endpoint, parsed), settings, node_addr="127.0.0.1")
    try:
        return handler.next_rendezvous().group_world_size
    finally:
        handler.shutdown()


@pytest.mark.etcd
def test_wait_for_etcd_returns_once_etcd_accepts_the_connection(etcd):
    result = run_script("wait_for_etcd.py", f"--endpoint={etcd.endpoints}", "--timeout=20")
    assert result.returncode == 0, result.stderr
    assert "is ready" in result.stdout


def test_wait_for_etcd_gives_up_after_its_timeout(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    result = run_script("wait_for_etcd.py", f"--endpoint={endpoint}", "--conf=dial_timeout=0.5,request_timeout=1",
                        "--timeout=1")
    assert result.returncode == 1
    assert f"etcd at {endpoint} not usable after" in result.stderr and "(--timeout 1)" in result.stderr
    assert time.monotonic() - started < 20


@pytest.mark.parametrize("conf, message", [
    ("bogus=1", "bogus"),
    ("user=elastic,password_file=/nonexistent/password", "/nonexistent/password"),
])
def test_wait_for_etcd_stops_at_once_when_the_settings_are_wrong(conf, message):
    result = run_script("wait_for_etcd.py", f"--endpoint=127.0.0.1:{free_port()}", f"--conf={conf}", "--timeout=30",
                        timeout=20)
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.etcd
def test_auth_setup_lets_only_the_jobs_user_in_and_is_idempotent(etcd, passwords, tmp_path):
    from elastic.rendezvous.errors import RendezvousConnectionError
    from elastic.rendezvous.backend_spec import spec_from_conf
    from elastic.rendezvous.registry import open_backend

    root, user = passwords
    first = setup_auth(etcd.endpoints, passwords)
    assert first.returncode == 0, first.stderr
    assert "auth enabled" in first.stdout
    conf = f"user={USER},password_file={user}"
    assert join_one_node_round(etcd.endpoints, conf) == 1
    waited = run_script("wait_for_etcd.py", f"--endpoint={etcd.endpoints}", f"--conf={conf}", "--timeout=20")
    assert waited.returncode == 0, waited.stderr
    with pytest.raises(RendezvousConnectionError):
        open_backend(spec_from_conf("etcd", etcd.endpoints, {})).release()  # anonymous: auth is on

    again = setup_auth(etcd.endpoints, passwords)
    assert again.returncode == 0, again.stderr
    assert "auth is already enabled" in again.stdout

    user.write_text("rotated-secret")  # the Secret changed: the next upgrade's hook applies it
    rotated = setup_auth(etcd.endpoints, passwords)
    assert rotated.returncode == 0, rotated.stderr
    assert join_one_node_round(etcd.endpoints, conf) == 1
    old = tmp_path / "old-password"
    old.write_text("job-secret")
    with pytest.raises(RendezvousConnectionError):
        open_backend(spec_from_conf("etcd", etcd.endpoints, {"user": USER, "password_file": str(old)})).release()


CHART_PREFIX = "/elastic/"
"""The --prefix the chart's auth Job passes by default (test_chart_render checks it)."""


def role_permissions(endpoint: str, root_password: str, role: str) -> list[tuple[int, bytes, bytes]]:
    """``(type, key, range_end)`` of every permission of ``role``, read as root."""
    import grpc
    from etcd3 import etcdrpc

    with grpc.insecure_channel(endpoint.split("://", 1)[-1]) as channel:
        auth = etcdrpc.AuthStub(channel)
        token = auth.Authenticate(etcdrpc.AuthenticateRequest(name="root", password=root_password), timeout=10).token
        found = auth.RoleGet(etcdrpc.AuthRoleGetRequest(role=role), metadata=(("token", token),), timeout=10).perm
    return [(perm.permType, perm.key, perm.range_end) for perm in found]


@pytest.mark.etcd
def test_an_agent_starts_as_the_user_the_setup_script_granted_only_the_namespace(etcd, passwords, tmp_path):
    from etcd3.etcdrpc import auth_pb2

    from elastic.testing.agents import clean_env

    root, user = passwords
    result = setup_auth(etcd.endpoints, passwords, f"--prefix={CHART_PREFIX}")
    assert result.returncode == 0, result.stderr
    assert role_permissions(etcd.endpoints, root.read_text().strip(), USER) == [
        (auth_pb2.Permission.READWRITE, b"/elastic/", b"/elastic0")]  # no more than docs/security.md grants
    conf = f"user={USER},password_file={user}"
    run_id = f"chart-{os.getpid()}-{time.monotonic_ns()}"
    waited = run_script("wait_for_etcd.py", f"--endpoint={etcd.endpoints}", f"--run-id={run_id}", f"--conf={conf}",
                        "--timeout=20")
    assert waited.returncode == 0, waited.stderr
    agent = subprocess.run([sys.executable, "-m", "elastic.run", "--nnodes=1", "--rdzv-backend=etcd",
                            f"--rdzv-endpoint={etcd.endpoints}", f"--rdzv-id={run_id}",
                            f"--rdzv-conf=last_call_timeout=1,{conf}", "-m", "this"],
                           capture_output=True, text=True, timeout=120, env=clean_env(), cwd=tmp_path)
    assert agent.returncode == 0, agent.stderr
    assert "Beautiful is better than ugly." in agent.stdout


@pytest.mark.etcd
def test_auth_setup_refuses_when_the_root_password_no_longer_matches(etcd, passwords):
    root, _ = passwords
    assert setup_auth(etcd.endpoints, passwords).returncode == 0
    root.write_text("another-root-password")
    result = setup_auth(etcd.endpoints, passwords)
    assert result.returncode == 1
    assert "the root password in the Secret no longer matches" in result.stderr


@pytest.mark.etcd
def test_auth_setup_and_the_workers_connection_work_over_tls_with_client_certificates(passwords):
    server = start_etcd(tls=True, client_cert_auth=True)
    try:
        files = server.tls_files
        tls = [f"--cacert={files.ca_cert}", f"--cert={files.client_cert}", f"--key={files.client_key}"]
        result = setup_auth(server.endpoints, passwords, *tls)
        assert result.returncode == 0, result.stderr
        conf = (f"cacert={files.ca_cert},cert={files.client_cert},key={files.client_key},"
                f"user={USER},password_file={passwords[1]}")
        waited = run_script("wait_for_etcd.py", f"--endpoint={server.endpoints}", f"--conf={conf}", "--timeout=20")
        assert waited.returncode == 0, waited.stderr
        assert join_one_node_round(server.endpoints, conf) == 1
    finally:
        server.close()


def test_auth_setup_waits_for_etcd_then_gives_up(passwords):
    result = setup_auth(f"127.0.0.1:{free_port()}", passwords, "--timeout=1")
    assert result.returncode == 1
    assert "unreachable after 1s" in result.stderr
