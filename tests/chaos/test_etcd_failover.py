"""Failover inside one call: a hung etcd member gets its share of the deadline, not all of it."""

from __future__ import annotations

import pytest

from backends.etcd import EtcdBackend, EtcdConfig

pytestmark = [pytest.mark.chaos, pytest.mark.etcd]


def test_a_call_moves_on_from_a_hung_member_and_the_next_write_starts_elsewhere(etcd_cluster_factory):
    cluster = etcd_cluster_factory(3)
    leader = cluster.leader()
    hung = next(member for member in cluster.members if member != leader)
    others = [member for member in cluster.members if member != hung]
    endpoints = ",".join(member.client_url() for member in [hung, *others])
    # 3 s for the whole call: were the hung member (listed first, connected) given all of it, the
    # read would time out; with its share (1 s) the call moves on and the next member answers.
    backend = EtcdBackend(EtcdConfig(endpoints=endpoints, request_timeout=3.0))
    try:
        backend.put("/failover/k", b"v1")
        cluster.pause(hung)
        assert backend.get("/failover/k").kv.value == b"v1"
        assert backend.put_if("/failover/k", b"v2", backend.get("/failover/k").kv.mod_revision).applied
        assert backend.get("/failover/k").kv.value == b"v2"
    finally:
        cluster.resume(hung)
        backend.close()
