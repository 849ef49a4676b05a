"""A running round whose watch history etcd compacted while the watches were down, on real etcd.

A shared etcd with auto-compaction may compact the history a member's watch would resume
from while the member's connection is down (an etcd restart, a partition). The watch then
cannot resume (CompactedError), and the member re-reads its round at one revision and
compares it with what it acted on (:func:`elastic.rendezvous.reconcile.reconcile`): nothing
changed is no change (its workers keep training); a member that left in the gap is lost.

Forced for real: the store is compacted past the watches' revisions, and the watches' stream
breaks (etcd restarts, or the member's own etcd member is killed while the others go on).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from backends.etcd import EtcdBackend, EtcdConfig
from elastic.rendezvous.api import MembershipChange, MembershipStatus
from elastic.rendezvous.handler import NodeSpec, RendezvousHandler
from elastic.rendezvous.settings import RendezvousSettings

from support.etcd_cluster import EtcdCluster

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

TTL = 10.0
"""Long enough for a member's lease to outlive its etcd member's restart."""


@pytest.fixture
def nodes():
    """Opens handlers (each on its own client to ``endpoints``) of one run; shuts all down."""
    namespace = f"/compaction-{uuid.uuid4().hex[:8]}"
    opened: list[RendezvousHandler] = []

    def make(node_id: str, endpoints: str) -> RendezvousHandler:
        settings = RendezvousSettings("job", 2, 2, namespace=namespace, lease_ttl=TTL, last_call_timeout=0.5,
                                      join_timeout=60.0)
        backend = EtcdBackend(EtcdConfig(endpoints, dial_timeout=1.0, request_timeout=2.0))
        handler = RendezvousHandler(settings, backend, NodeSpec("127.0.0.1", node_id=node_id), owns_backend=True)
        opened.append(handler)
        return handler

    yield make
    for handler in opened:
        handler.shutdown()


def form_round(*handlers: RendezvousHandler) -> None:
    with ThreadPoolExecutor(len(handlers)) as pool:
        infos = list(pool.map(lambda handler: handler.next_rendezvous(), handlers, timeout=60))
    assert {info.group_world_size for info in infos} == {len(handlers)}


def compact_past_everything(admin: EtcdBackend, namespace_free_key: str) -> int:
    """Compact the store at a revision past every watch's (a write outside the run moves it on)."""
    revision = admin.put(namespace_free_key, b"move the revision on")
    admin.compact(revision)
    return revision


def wait_for_change(handler: RendezvousHandler, timeout: float) -> MembershipStatus:
    seen = threading.Event()
    handler.on_change(seen.set)
    deadline = time.monotonic() + timeout
    while (status := handler.membership()).change is None and (left := deadline - time.monotonic()) > 0:
        seen.wait(left)
        seen.clear()
    return status


def wait_for_lines(caplog, needle: str, count: int, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        lines = [record.getMessage() for record in caplog.records if needle in record.getMessage()]
        if len(lines) >= count or time.monotonic() >= deadline:
            return lines
        time.sleep(0.05)


def test_an_etcd_restart_after_compaction_with_nothing_changed_restarts_no_one(nodes, caplog):
    with EtcdCluster(1) as etcd, EtcdBackend(EtcdConfig(etcd.endpoints())) as admin:
        a, b = nodes("a", etcd.endpoints()), nodes("b", etcd.endpoints())
        form_round(a, b)
        compact_past_everything(admin, "/elsewhere/k")
        with caplog.at_level(logging.INFO, logger="elastic.rendezvous.monitor"):
            member = etcd.members[0]
            etcd.kill(member)  # every watch's stream breaks; it resumes from before the compaction
            etcd.start(member)
            lines = wait_for_lines(caplog, "watch history was compacted", 2, timeout=30)
        assert len(lines) == 2, (lines, a.membership(), b.membership())  # one re-read per member
        assert all(line.endswith("nothing changed") for line in lines), lines
        time.sleep(1.0)  # anything the resumed watches still had to say
        assert (a.membership().change, b.membership().change) == (None, None)
        b.shutdown()  # and the watches live on: a member that leaves now is seen leaving
        status = wait_for_change(a, TTL)
        assert status.change is MembershipChange.MEMBER_LOST and status.reason.startswith("member lost: b in round")
        assert status.reason.endswith("(its agent shut down)"), status.reason  # its departure note, seen too


def test_a_member_lost_while_the_watch_history_was_compacted_is_named(nodes, caplog):
    with EtcdCluster(3) as etcd:
        m0, m1, m2 = etcd.members
        a = nodes("a", m0.client_url())  # a talks to m0 only: killing m0 cuts a off, the cluster goes on
        b = nodes("b", m1.client_url())
        form_round(a, b)
        with EtcdBackend(EtcdConfig(f"{m1.client_url()},{m2.client_url()}")) as admin:
            with caplog.at_level(logging.INFO, logger="elastic.rendezvous.monitor"):
                etcd.kill(m0)
                b.shutdown()  # b leaves while a cannot see it: its keys go with its lease ...
                compact_past_everything(admin, "/elsewhere/k")  # ... and so does that history
                etcd.start(m0)  # a's watches resume from before the compaction
                status = wait_for_change(a, 30)
                lines = wait_for_lines(caplog, "watch history was compacted", 1, timeout=5)
        assert status.change is MembershipChange.MEMBER_LOST, status
        assert "member lost: b" in status.reason
        assert lines and lines[0].endswith("member lost: b (join key gone)"), lines
