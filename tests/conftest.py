"""Shared fixtures. Each backend's fixtures live in their own section below."""

from __future__ import annotations

import pytest


# -- etcd --------------------------------------------------------------------------------------
# One real etcd for the whole session, with auth on (the contract's wrong-credential test needs
# it). ETCD_TEST_BACKEND picks how it is provided (see elastic.testing.etcd_server); when none
# can start, the tests using it fail with EtcdServerError, never skip.
@pytest.fixture(scope="session")
def etcd_server():
    """The session's etcd server; stopped (by PID, for the binary) at the end of the session."""
    from elastic.testing.etcd_server import EtcdServerOptions, start_etcd_server

    server = start_etcd_server(EtcdServerOptions(auth=True))
    try:
        yield server
    finally:
        server.close()
