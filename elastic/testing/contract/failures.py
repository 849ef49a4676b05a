"""The backend contract's failures: what a client reports when credentials, the client or the server fail."""

from __future__ import annotations

import time
import uuid

import pytest

from backends.errors import BackendAuthError, BackendClosedError, BackendConnectionError, BackendTimeoutError
from elastic.testing.contract.fixtures import ContractFixtures


class FailureContract(ContractFixtures):
    """Failures: wrong credentials, a closed client, and a server stopped under a live client."""

    def test_wrong_credentials_give_an_auth_error(self, harness):
        with pytest.raises(BackendAuthError):
            client = harness.connect_with_wrong_credentials()
            try:
                client.get("/contract/auth-probe")
            finally:
                client.close()

    def test_a_closed_client_refuses_calls(self, harness):
        client = harness.connect()
        client.close()
        client.close()
        with pytest.raises(BackendClosedError):
            client.get("/contract/closed-probe")

    def test_a_server_stopped_under_a_client_gives_a_connection_error_within_its_timeout(self, harness):
        request_timeout = 2.0
        client = harness.connect(request_timeout=request_timeout)
        try:
            key = f"/contract/{uuid.uuid4().hex[:12]}/k"
            client.put(key, b"v")
            watch = client.watch_prefix(key)
            harness.stop_server()
            try:
                started = time.monotonic()
                with pytest.raises((BackendConnectionError, BackendTimeoutError)):
                    client.get(key)
                elapsed = time.monotonic() - started
                assert elapsed <= request_timeout + 1.0, f"took {elapsed:.2f}s"
            finally:
                harness.start_server()
            watch.cancel()
        finally:
            client.close()
        with harness.connect() as fresh:
            assert fresh.put(key, b"again") > 0
