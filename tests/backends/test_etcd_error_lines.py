"""The launcher's one line for each way of failing to use etcd, against real servers.

Each case runs ``elasticrun`` against a real etcd (plain with auth, or TLS), a port nothing
listens on, a name that cannot resolve (``.invalid``, RFC 6761), a plain HTTP server and the
built-in store: it must exit 1 with one line that names the endpoint and the fix, no traceback,
and no "whether it applied is unknown" (nothing was written: the probe is a read).
"""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from elastic.testing.agents import clean_env
from elastic.testing.etcd_server import ROOT_USER, EtcdServerOptions, start_etcd_server
from elastic.testing.ports import free_port
from elastic.testing.tls import make_tls_files

from support.etcd_auth import JOB_PASSWORD, job_user_lines, run_lines

pytestmark = pytest.mark.etcd

PLAIN_PASSWORD_WARNING = "goes to"  # the warning about a password over plain http, printed before


@pytest.fixture(scope="module")
def tls_etcd():
    server = start_etcd_server(EtcdServerOptions(tls=True))
    yield server
    server.close()


@pytest.fixture(scope="module")
def not_etcd():
    """A plain HTTP server and the built-in store: ports that answer, but not as etcd."""
    from backends.tcp.server import start_server

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    store = start_server("127.0.0.1", 0, "token")
    yield {"http": f"127.0.0.1:{web.server_address[1]}", "store": f"127.0.0.1:{store.port}"}
    store.stop()
    web.shutdown()
    web.server_close()


class _Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def launch(tmp_path: Path, endpoint: str, conf: str = "") -> tuple[int, list[str]]:
    argv = [sys.executable, "-m", "elastic.run", "--nnodes=1", "--rdzv-backend=etcd", f"--rdzv-endpoint={endpoint}",
            "--rdzv-id=error-lines", *([f"--rdzv-conf={conf}"] if conf else []), "-m", "this"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=clean_env(), cwd=tmp_path)
    lines = [line for line in result.stderr.splitlines() if PLAIN_PASSWORD_WARNING not in line]
    return result.returncode, lines


def only_line(tmp_path: Path, endpoint: str, conf: str = "") -> str:
    code, lines = launch(tmp_path, endpoint, conf)
    assert code == 1 and len(lines) == 1, lines
    [line] = lines
    assert line.startswith("elasticrun: Cannot use the etcd backend at ") and "applied" not in line, line
    return line


def files(tmp_path: Path, **contents: str) -> dict[str, Path]:
    paths = {}
    for name, text in contents.items():
        paths[name] = tmp_path / name
        paths[name].write_text(text)
    return paths


def test_a_name_that_does_not_resolve(tmp_path):
    line = only_line(tmp_path, "etcd-0.invalid:2379,etcd-1.invalid:2379")
    assert "etcd-0.invalid:2379, etcd-1.invalid:2379: the host name does not resolve; fix --rdzv-endpoint" in line


def test_a_refused_connection(tmp_path):
    port = free_port()
    line = only_line(tmp_path, f"127.0.0.1:{port}")
    assert f"127.0.0.1:{port}: nothing listens there (connection refused); start etcd" in line


def test_plain_http_to_a_tls_etcd(tmp_path, tls_etcd):
    endpoint = tls_etcd.endpoints.removeprefix("https://")
    line = only_line(tmp_path, endpoint)
    assert f"{endpoint}: it serves TLS while the endpoint says plain http; use https://" in line


def test_https_to_a_plain_etcd(tmp_path, etcd_server):
    endpoint = etcd_server.endpoints.removeprefix("http://")
    line = only_line(tmp_path, f"https://{endpoint}")
    assert f"{endpoint}: it serves plain http while TLS is configured; use http://" in line


def test_a_ca_that_did_not_sign_the_servers_certificate(tmp_path, tls_etcd):
    other = make_tls_files(tmp_path / "other")
    line = only_line(tmp_path, tls_etcd.endpoints, f"cacert={other.ca_cert}")
    assert "the server's certificate is not signed by the CA this client trusts; pass the CA" in line
    assert tls_etcd.endpoints.removeprefix("https://") in line


def test_a_wrong_password(tmp_path, etcd_server):
    secret = files(tmp_path, pw="not-the-password")["pw"]
    endpoint = etcd_server.endpoints.removeprefix("http://")
    line = only_line(tmp_path, endpoint, f"user=root,password_file={secret}")
    assert f"etcd at {endpoint} rejected user 'root'" in line and "password_file=" in line


def test_no_user_against_an_etcd_with_auth(tmp_path, etcd_server):
    endpoint = etcd_server.endpoints.removeprefix("http://")
    line = only_line(tmp_path, endpoint)
    assert endpoint in line and "auth enabled: pass --rdzv-conf user=NAME,password_file=FILE" in line


def test_a_user_whose_role_has_no_grant_on_the_namespace(tmp_path, etcd_server):
    tag = uuid.uuid4().hex[:8]
    user, namespace = f"elsewhere-{tag}", f"/team-{tag}"
    run_lines(job_user_lines(user, f"/elsewhere-{tag}/"), etcd_server.endpoints, {JOB_PASSWORD: "pw"},
              login=f"{ROOT_USER}:{etcd_server.options.password}")
    secret = files(tmp_path, pw="pw")["pw"]
    endpoint = etcd_server.endpoints.removeprefix("http://")
    line = only_line(tmp_path, endpoint, f"namespace={namespace},user={user},password_file={secret}")
    assert (f"etcd user '{user}' may not read the run's keys under '{namespace}/error-lines/' (etcd: permission "
            f"denied); grant its role readwrite on the namespace prefix: etcdctl role grant-permission "
            f"--prefix=true ROLE readwrite {namespace}/ ") in line, line


@pytest.mark.parametrize("service", ["http", "store"])
def test_a_port_that_is_not_etcd(tmp_path, not_etcd, service):
    line = only_line(tmp_path, not_etcd[service])
    assert not_etcd[service] in line and "not an etcd client URL" in line


# -- the built-in store (tcp, c10d) ------------------------------------------------------------
# A store that does not answer is waited for until the join timeout (nodes start in any order,
# elastic.rendezvous.store_wait): one warning while waiting, then the one line that ends the run.
def launch_store(tmp_path: Path, backend: str, endpoint: str, conf: str = "") -> str:
    argv = [sys.executable, "-m", "elastic.run", "--nnodes=1", f"--rdzv-backend={backend}",
            f"--rdzv-endpoint={endpoint}", "--rdzv-id=error-lines", f"--rdzv-conf=join_timeout=3{conf}",
            "-m", "this"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=clean_env(), cwd=tmp_path)
    lines = [line for line in result.stderr.splitlines() if not line.startswith("elasticrun: warning: ")]
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith("elasticrun: ") and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.mark.parametrize("backend", ["tcp", "c10d"])
def test_a_store_name_that_does_not_resolve(tmp_path, backend):
    line = launch_store(tmp_path, backend, "store-0.invalid:29400")
    assert "store-0.invalid:29400" in line and "name or service not known" in line.lower(), line
    assert "fix --rdzv-endpoint" in line, line


def test_a_store_that_refuses_the_connection(tmp_path):
    port = free_port()
    line = launch_store(tmp_path, "tcp", f"127.0.0.1:{port}")
    assert f"127.0.0.1:{port}" in line and "connection refused" in line and "fix --rdzv-endpoint" in line, line


def test_a_store_that_rejects_the_token(tmp_path, not_etcd):
    secret = files(tmp_path, token="not-the-token")["token"]
    line = launch_store(tmp_path, "tcp", not_etcd["store"], f",token_file={secret}")
    assert f"The elastic-store at {not_etcd['store']} rejected this node's token" in line and "token_file=" in line


def test_an_etcd_port_given_as_a_store(tmp_path, etcd_server):
    endpoint = etcd_server.endpoints.removeprefix("http://")
    line = launch_store(tmp_path, "tcp", endpoint)
    assert endpoint in line and "connection reset by peer" in line.lower(), line
