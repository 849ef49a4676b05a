"""Finding 1: the c10d host does not serve the store to every interface without a token unless
told to, and ``elastic-store`` warns when it listens off loopback without one."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from elastic.rendezvous.errors import RendezvousConfigError
from elastic.rendezvous.backend_spec import spec_from_conf
from elastic.rendezvous.registry import open_backend
from hostile import REPO, StoreProcess
from elastic.testing.ports import free_port


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_an_open_c10d_host_off_loopback_is_refused_naming_token_file_and_the_opt_out():
    port = free_port()
    with pytest.raises(RendezvousConfigError) as caught:
        opened = open_backend(spec_from_conf("c10d", f"0.0.0.0:{port}", {"is_host": "1", "request_timeout": "2"}))
        opened.release()
    message = str(caught.value)
    assert "token_file=" in message and "insecure_open_store=1" in message
    assert "\n" not in message
    assert not listening(port)
    for options in ({"insecure_open_store": "1"}, {"token": "s3cret"}):  # torchrun-style, or safe
        opened = open_backend(spec_from_conf("c10d", f"0.0.0.0:{port}", {"is_host": "1", "request_timeout": "2", **options}))
        try:
            assert opened.hosted_endpoint is not None
            assert opened.backend.put("/k", b"v") > 1
        finally:
            opened.release()


def test_a_loopback_c10d_host_binds_loopback_only_and_needs_no_token():
    port = free_port()
    opened = open_backend(spec_from_conf("c10d", f"127.0.0.1:{port}", {"is_host": "1"}))
    try:
        assert opened.hosted_endpoint == f"127.0.0.1:{port}"
    finally:
        opened.release()
    with pytest.raises(RendezvousConfigError):  # the same node, asked to serve every interface
        open_backend(spec_from_conf("c10d", f"0.0.0.0:{port}", {"is_host": "1"})).release()


def test_elastic_store_off_loopback_without_a_token_warns():
    with StoreProcess() as loopback:
        assert "--token-file" not in loopback.stderr()
    proc = subprocess.Popen([sys.executable, "-m", "backends.tcp.cli", "--host", "0.0.0.0", "--port", "0"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "listening on" in proc.stdout.readline()
    finally:
        proc.terminate()
        _, stderr = proc.communicate(10)
    warnings = [line for line in stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "--token-file" in warnings[0], stderr
