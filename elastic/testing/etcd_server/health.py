"""Bringing a started etcd into service: wait until ``/health`` says so, then switch auth on."""

from __future__ import annotations

import json
import logging
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import grpc
from etcd3 import etcdrpc

from elastic.testing.etcd_server.server import ROOT_USER, EtcdServer, EtcdServerError

log = logging.getLogger(__name__)


def _ssl_context(server: EtcdServer) -> ssl.SSLContext | None:
    files = server.tls_files
    if files is None:
        return None
    context = ssl.create_default_context(cafile=str(files.ca_cert))
    context.load_cert_chain(str(files.client_cert), str(files.client_key))
    return context


def wait_healthy(server: EtcdServer, url: str, timeout: float, process: "subprocess.Popen[bytes] | None") -> None:
    """Poll ``GET /health`` until it says healthy; fail early if ``process`` exits.

    Raises:
        EtcdServerError: not healthy within ``timeout`` seconds, or the process exited.
    """
    deadline = time.monotonic() + timeout
    context = _ssl_context(server)
    last = "no answer yet"
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise EtcdServerError(f"etcd exited with code {process.returncode} during startup:\n{server.failure_log()}")
        try:
            with urllib.request.urlopen(url, timeout=1.0, context=context) as response:
                if json.loads(response.read() or b"{}").get("health") in ("true", True):
                    return
                last = f"HTTP {response.status}"
        except (OSError, ValueError, urllib.error.URLError) as error:
            last = str(error)
        if process is not None:
            try:
                process.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
        else:
            time.sleep(0.2)
    raise EtcdServerError(f"etcd at {url} was not healthy within {timeout}s (last: {last}).\n{server.failure_log()}")


def enable_auth(server: EtcdServer, password: str) -> None:
    """Create user root (role root) with ``password`` and enable auth, over the v3 gRPC auth API."""
    config = server.client_config(user=None, password=None)
    endpoint = config.endpoints[0]  # type: ignore[index]
    files = server.tls_files
    if files is not None:
        credentials = grpc.ssl_channel_credentials(
            files.ca_cert.read_bytes(), files.client_key.read_bytes(), files.client_cert.read_bytes()
        )
        channel = grpc.secure_channel(endpoint.netloc, credentials)
    else:
        channel = grpc.insecure_channel(endpoint.netloc)
    with channel:
        auth = etcdrpc.AuthStub(channel)
        auth.UserAdd(etcdrpc.AuthUserAddRequest(name=ROOT_USER, password=password), timeout=10)
        auth.RoleAdd(etcdrpc.AuthRoleAddRequest(name="root"), timeout=10)
        auth.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user=ROOT_USER, role="root"), timeout=10)
        auth.AuthEnable(etcdrpc.AuthEnableRequest(), timeout=10)
    log.info("Enabled auth on etcd at %s (user %s)", endpoint, ROOT_USER)
