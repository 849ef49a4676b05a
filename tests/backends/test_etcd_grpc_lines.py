"""gRPC's own log lines and the etcd client: a failed TLS handshake is our one line, not gRPC's too.

gRPC's core writes ``I1129 ... ssl_transport_security.cc:2563] Handshake failed ...`` to stderr
for every failed handshake unless ``GRPC_VERBOSITY`` says otherwise, which it reads when grpcio
is imported. Importing ``backends.etcd`` imports grpcio with ``GRPC_VERBOSITY=ERROR`` unless the
user set the variable, and takes it out of the environment again (workers inherit the user's).
Each case runs a fresh interpreter against a real etcd serving TLS, with a CA that did not sign
its certificate, as stock torchrun with our plugin runs the client (no console set-up of ours).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from elastic.testing.agents import clean_env
from elastic.testing.etcd_server import EtcdServerOptions, start_etcd_server
from elastic.testing.tls import make_tls_files

pytestmark = pytest.mark.etcd

CHILD = """
import os, sys
from backends.errors import BackendError
from backends.etcd import EtcdBackend, EtcdConfig
print("GRPC_VERBOSITY=" + os.environ.get("GRPC_VERBOSITY", "-"))
with EtcdBackend(EtcdConfig(sys.argv[1], ca_cert=sys.argv[2], dial_timeout=1, request_timeout=2)) as client:
    try:
        client.get("/k")
    except BackendError as error:
        print(type(error).__name__)
"""


@pytest.fixture(scope="module")
def tls_etcd():
    server = start_etcd_server(EtcdServerOptions(client_cert_auth=True))
    yield server
    server.close()


def handshake_with_a_wrong_ca(tls_etcd, tmp_path, **environ: str) -> subprocess.CompletedProcess:
    other = make_tls_files(tmp_path / "other")
    env = {key: value for key, value in clean_env(**environ).items() if environ.get(key) != ""}
    return subprocess.run([sys.executable, "-c", CHILD, tls_etcd.endpoints, str(other.ca_cert)], env=env,
                          capture_output=True, text=True, timeout=60)


def test_grpcs_handshake_lines_stay_off_stderr_and_the_environment_stays_as_given(tls_etcd, tmp_path):
    result = handshake_with_a_wrong_ca(tls_etcd, tmp_path, GRPC_VERBOSITY="")
    assert result.stdout.split() == ["GRPC_VERBOSITY=-", "BackendAuthError"], result.stderr
    assert "Handshake failed" not in result.stderr and "ssl_transport_security" not in result.stderr


def test_a_grpc_verbosity_the_user_set_is_left_as_it_is(tls_etcd, tmp_path):
    result = handshake_with_a_wrong_ca(tls_etcd, tmp_path, GRPC_VERBOSITY="INFO")
    assert result.stdout.split() == ["GRPC_VERBOSITY=INFO", "BackendAuthError"], result.stderr
    assert "Handshake failed" in result.stderr
