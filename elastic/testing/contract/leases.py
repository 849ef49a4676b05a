"""The backend contract's leases."""

from __future__ import annotations

import time

import pytest

from backends.api import ABSENT
from backends.errors import LeaseNotFoundError
from backends.session import Session
from elastic.testing.contract.fixtures import LEASE_TTL, ContractFixtures, collect_events, describe


class LeaseContract(ContractFixtures):
    """Leases: expiry within TTL + 1 s, keepalive, revoke, writes bound to dead leases, and a
    :class:`~backends.session.Session` over them."""

    def test_lease_expiry_removes_keys_and_delivers_delete_within_ttl_plus_one_second(self, backend, prefix):
        lease = backend.grant(LEASE_TTL)
        granted_at = time.monotonic()
        put_revision = backend.put(prefix + "ephemeral", b"v", lease=lease.id)
        assert backend.get(prefix + "ephemeral").kv.lease == lease.id
        with backend.watch_prefix(prefix, start_revision=put_revision + 1) as watch:
            events = collect_events(watch, 1, timeout=LEASE_TTL + 3)
        seen_after = time.monotonic() - granted_at
        assert describe(events) == [("delete", prefix + "ephemeral", b"")]
        assert seen_after <= lease.ttl + 1.0, f"DELETE seen {seen_after:.2f}s after grant"
        assert backend.get(prefix + "ephemeral").kv is None
        with pytest.raises(LeaseNotFoundError):
            backend.keepalive(lease.id)

    def test_keepalive_keeps_keys_alive_past_several_ttls(self, backend, prefix):
        lease = backend.grant(LEASE_TTL)
        backend.put(prefix + "kept", b"v", lease=lease.id)
        deadline = time.monotonic() + 3 * lease.ttl
        while time.monotonic() < deadline:
            assert backend.keepalive(lease.id) > 0
            time.sleep(lease.ttl / 4)
        assert backend.get(prefix + "kept").kv is not None
        assert backend.revoke(lease.id)

    def test_revoke_deletes_the_leases_keys_at_once(self, backend, prefix):
        lease = backend.grant(30)
        backend.put(prefix + "a", b"v", lease=lease.id)
        backend.put_if(prefix + "b", b"v", ABSENT, lease=lease.id)
        assert backend.revoke(lease.id) is True
        assert backend.get_prefix(prefix).kvs == ()
        assert backend.revoke(lease.id) is False
        with pytest.raises(LeaseNotFoundError):
            backend.keepalive(lease.id)

    def test_a_write_bound_to_an_unknown_lease_is_refused(self, backend, prefix):
        lease = backend.grant(30)
        backend.revoke(lease.id)
        with pytest.raises(LeaseNotFoundError):
            backend.put(prefix + "k", b"v", lease=lease.id)
        assert backend.get(prefix + "k").kv is None

    def test_a_session_keeps_its_lease_alive_and_reports_loss_when_revoked(self, backend, prefix):
        with Session(backend, LEASE_TTL) as session:
            backend.put(prefix + "member", b"v", lease=session.lease_id)
            time.sleep(2 * session.ttl)
            assert backend.get(prefix + "member").kv is not None
            assert session.alive
            lost = []
            session.on_lost(lost.append)
            backend.revoke(session.lease_id)
            assert session.wait_lost(timeout=session.ttl + 1)
            assert lost and not session.alive
