"""etcd-specific behaviour of the etcd v3 backend, against real etcd servers.

The contract suite (test_etcd_contract.py) covers the shared semantics; these tests cover what
only etcd has: restarts under live watches, compaction, failover between endpoints, TLS, auth,
server-side limits, and the translation of gRPC errors.
"""

from __future__ import annotations

import http.server
import logging
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from backends.api import ABSENT, WatchEvent
from backends.errors import (
    BackendAuthError,
    BackendClosedError,
    BackendConnectionError,
    BackendError,
    BackendPermissionError,
    BackendTimeoutError,
    CompactedError,
    EndpointError,
    LeaseNotFoundError,
    ProtocolError,
    StoreFullError,
    ValueTooLargeError,
)
from backends.etcd import EtcdBackend, EtcdConfig
from backends.etcd.connection import EtcdConnection
from backends.etcd.convert import prefix_range_end
from backends.etcd.translate import DialFailure, RequestNotSent, diagnose_dial_failure, translate_rpc_error
from elastic.testing.etcd_server import ROOT_USER, EtcdServerOptions, find_etcdctl_binary, start_etcd_server
from elastic.testing.tls import make_tls_files, rotate_server_ca

from support.etcd_auth import JOB_PASSWORD, ROOT_PASSWORD, job_user_lines, least_privilege_lines, run_lines
from support.etcd_cluster import EtcdCluster
from support.freeze import freeze, thaw

pytestmark = pytest.mark.etcd


# -- fixtures and helpers ----------------------------------------------------------------------
@pytest.fixture
def start_etcd():
    """Start dedicated etcd servers for one test; every one is stopped (by PID) afterwards."""
    servers = []

    def start(**options):
        server = start_etcd_server(EtcdServerOptions(**options))
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def prefix():
    return f"/etcd-test/{uuid.uuid4().hex[:12]}/"


@pytest.fixture
def client(etcd_server):
    with etcd_server.connect() as backend:
        yield backend


def dead_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def collect(watch, count: int, timeout: float) -> list[WatchEvent]:
    deadline = time.monotonic() + timeout
    events: list[WatchEvent] = []
    while len(events) < count and time.monotonic() < deadline:
        events.extend(watch.get(timeout=max(deadline - time.monotonic(), 0.0)))
    return events


def watcher_count(server) -> float:
    """etcd's gauge of live server-side watchers, from /metrics."""
    with urllib.request.urlopen(f"{server.endpoints}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("etcd_debugging_mvcc_watcher_total "):
                return float(line.split()[1])
    raise AssertionError("etcd_debugging_mvcc_watcher_total missing from /metrics")


class FakeRpcError(grpc.RpcError):
    """An RpcError with a chosen status, as gRPC raises them."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


# -- restarts, watches and compaction ----------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("options", [{"auth": True}, {"client_cert_auth": True}], ids=["auth", "tls"])
@pytest.mark.parametrize("graceful", [True, False], ids=["sigterm", "sigkill"])
def test_a_watch_resumes_after_an_etcd_restart_without_losing_or_repeating_events(start_etcd, prefix, graceful,
                                                                                  options):
    # Stopped gracefully, etcd serving TLS ends every open call with "INTERNAL: Stream removed"
    # (its gRPC runs inside Go's HTTP/2 server then): a lost connection, like any other.
    server = start_etcd(**options)
    with server.connect(watch_reconnect_timeout=20) as backend:
        watch = backend.watch_prefix(prefix)
        before = [backend.put(f"{prefix}{i}", b"before") for i in range(3)]
        assert [event.revision for event in collect(watch, 3, timeout=5)] == before

        server.stop(graceful=graceful)
        server.start()
        # The same client writes again: its auth token died with the old process.
        after = [backend.put(f"{prefix}{i}", b"after") for i in range(3, 6)]
        events = collect(watch, 3, timeout=10)
        assert watch.get(timeout=0.5) == []
        watch.cancel()
    assert [(event.kv.key, event.revision) for event in events] == [
        (f"{prefix}{i}", rev) for i, rev in zip(range(3, 6), after, strict=True)
    ]


@pytest.mark.slow
def test_a_watch_that_loses_its_connection_says_it_resumes_not_that_a_write_may_have_applied(start_etcd, prefix,
                                                                                             caplog):
    server = start_etcd()
    with server.connect(watch_reconnect_timeout=20) as backend, caplog.at_level(logging.WARNING):
        watch = backend.watch_prefix(prefix)
        backend.put(f"{prefix}a", b"before")
        assert len(collect(watch, 1, timeout=5)) == 1
        server.stop(graceful=False)
        server.start()
        after = backend.put(f"{prefix}b", b"after")
        assert [event.revision for event in collect(watch, 1, timeout=15)] == [after]
        watch.cancel()
    [line] = [record.getMessage() for record in caplog.records if "lost its connection" in record.getMessage()]
    assert line.startswith(f"etcd watch on {server.endpoints.removeprefix('http://')} lost its connection ("), line
    assert line.endswith("; watches resume once etcd answers, each from the revision after the last event it "
                         "delivered: no change is missed or repeated (1 watch)"), line
    assert "applied" not in line and "resend" not in line, line


def test_a_paused_etcd_times_calls_out_and_the_client_and_its_watch_carry_on_once_it_resumes(start_etcd, prefix):
    server = start_etcd()
    with server.connect(request_timeout=1.0, dial_timeout=1.0) as backend:
        watch = backend.watch_prefix(prefix)
        first = backend.put(prefix + "a", b"1")
        assert [event.revision for event in collect(watch, 1, timeout=5)] == [first]
        pid = server.pid
        freeze(pid)  # alive to TCP, silent to gRPC; returns once every thread has stopped
        try:
            started = time.monotonic()
            with pytest.raises(BackendTimeoutError):
                backend.get(prefix + "a")
            assert time.monotonic() - started < 3.0
        finally:
            thaw(pid)
        second = backend.put(prefix + "b", b"2")
        assert backend.get(prefix + "b").kv.mod_revision == second
        assert [event.revision for event in collect(watch, 1, timeout=10)] == [second]
        watch.cancel()


def test_a_watch_resuming_into_compacted_history_fails_with_compacted(client, prefix):
    watch = client.watch_prefix(prefix)
    client.put(prefix + "a", b"1")
    delivered = client.put(prefix + "b", b"2")
    assert [event.revision for event in collect(watch, 2, timeout=5)][-1] == delivered
    for _ in range(3):
        last = client.put(prefix[:-1] + "-outside/" + uuid.uuid4().hex, b"x")
    client.compact(last)
    client._watch_hub.interrupt()  # fault injection: break the live gRPC stream under the watch
    with pytest.raises(CompactedError) as raised:
        watch.get(timeout=10)
    assert raised.value.requested_revision == delivered + 1
    assert raised.value.compact_revision == last


def test_a_quiet_watch_resumes_past_history_others_wrote_and_compacted(etcd_server, prefix):
    # Issue 27 item 1: a job's prefixes stay quiet for minutes while other tenants write and
    # compact; resuming from the last event + 1 then always met compacted history.
    with etcd_server.connect(watch_progress_interval=0.2) as client:
        quiet = client.watch_prefix(prefix + "quiet/")
        delivered = client.put(prefix + "quiet/k", b"1")
        assert [event.revision for event in collect(quiet, 1, timeout=5)] == [delivered]
        for _ in range(3):
            last = client.put(prefix + "other/" + uuid.uuid4().hex, b"x")
        client.compact(last)
        deadline = time.monotonic() + 10
        while not any(r.resume_revision > last for r in client._watch_hub._live) and time.monotonic() < deadline:
            time.sleep(0.05)  # two progress reports: the watch adopts the first one's revision
        client._watch_hub.interrupt()
        revision = client.put(prefix + "quiet/k", b"2")
        assert [event.revision for event in collect(quiet, 1, timeout=10)] == [revision]
        quiet.cancel()


def test_a_stream_wide_progress_report_is_adopted_one_report_later():
    from backends.etcd.watch import WatchHub, WatchRegistration

    connection = EtcdConnection(EtcdConfig(f"127.0.0.1:{dead_port()}"))
    try:
        registration = WatchRegistration(WatchHub(connection).cancel, "/p/", start_revision=10)
        registration.note_stream_progress(40)  # may have overtaken events at or below 40
        assert registration.resume_revision == 10
        registration.note_stream_progress(55)
        assert registration.resume_revision == 41
        registration.create_request()  # a new stream: the last report came on the old one
        registration.note_stream_progress(60)
        assert registration.resume_revision == 41
    finally:
        connection.close()


def test_a_progress_notification_moves_the_resume_point_past_quiet_history():
    from backends.etcd.watch import WatchHub, WatchRegistration

    connection = EtcdConnection(EtcdConfig(f"127.0.0.1:{dead_port()}"))
    try:
        registration = WatchRegistration(WatchHub(connection).cancel, "/p/", start_revision=10)
        assert registration.resume_revision == 10
        registration.note_progress(42)
        registration.note_progress(30)
        assert registration.resume_revision == 43
    finally:
        connection.close()


def test_many_watches_share_one_stream_and_each_sees_only_its_prefix(client, prefix):
    baseline = threading.active_count()
    watches = [client.watch_prefix(f"{prefix}{i}/") for i in range(40)]
    revisions = [client.put(f"{prefix}{i}/k", str(i).encode()) for i in range(40)]
    for i, watch in enumerate(watches):
        (event,) = collect(watch, 1, timeout=5)
        assert (event.kv.key, event.kv.value, event.revision) == (f"{prefix}{i}/k", str(i).encode(), revisions[i])
        assert watch.get(timeout=0) == []
    # One reader thread and one gRPC request thread for all 40 (was three threads per watch).
    assert threading.active_count() - baseline <= 4
    assert client._watch_hub.live_count == 40
    for watch in watches:
        watch.cancel()
    assert client._watch_hub.live_count == 0


def test_cancelling_one_watch_leaves_the_others_on_the_stream_running(client, prefix):
    keep = client.watch_prefix(prefix + "keep/")
    dropped = client.watch_prefix(prefix + "drop/")
    client.put(prefix + "keep/1", b"1")
    assert len(collect(keep, 1, timeout=5)) == 1
    dropped.cancel()
    client.put(prefix + "drop/1", b"x")
    revision = client.put(prefix + "keep/2", b"2")
    assert [event.revision for event in collect(keep, 1, timeout=5)] == [revision]
    with pytest.raises(BackendClosedError):
        dropped.get(timeout=0.2)
    keep.cancel()


def test_a_watch_cancelled_before_etcd_confirms_it_is_cancelled_on_the_server(etcd_server, client, prefix):
    baseline = watcher_count(etcd_server)
    with client.watch_prefix(prefix + "last/") as last:
        first = client.put(prefix + "last/1", b"v")
        assert [event.revision for event in collect(last, 1, timeout=5)] == [first]  # the stream is open
        for i in range(20):
            client.watch_prefix(f"{prefix}{i}/").cancel()  # cancelled while its create is in flight
        second = client.put(prefix + "last/2", b"v")
        assert [event.revision for event in collect(last, 1, timeout=5)] == [second]
    deadline = time.monotonic() + 5
    while watcher_count(etcd_server) > baseline and time.monotonic() < deadline:
        time.sleep(0.05)
    assert watcher_count(etcd_server) <= baseline
    assert client._watch_hub.live_count == 0


def test_after_a_broken_stream_only_the_watch_whose_history_is_compacted_fails(client, prefix):
    stale = client.watch_prefix(prefix + "stale/")
    delivered = client.put(prefix + "stale/k", b"1")
    assert [event.revision for event in collect(stale, 1, timeout=5)] == [delivered]
    for _ in range(3):
        last = client.put(prefix + "other/" + uuid.uuid4().hex, b"x")
    client.compact(last)
    fresh = client.watch_prefix(prefix + "fresh/")  # starts after the compaction point
    assert collect(fresh, 1, timeout=0.3) == []  # created on the stream before it breaks
    client._watch_hub.interrupt()
    with pytest.raises(CompactedError) as raised:
        stale.get(timeout=10)
    assert raised.value.requested_revision == delivered + 1
    revision = client.put(prefix + "fresh/k", b"2")
    assert [event.revision for event in collect(fresh, 1, timeout=10)] == [revision]
    fresh.cancel()


@pytest.mark.slow
def test_every_watch_on_the_stream_resumes_after_an_etcd_restart(start_etcd, prefix):
    server = start_etcd()
    with server.connect(watch_reconnect_timeout=20) as backend:
        watches = [backend.watch_prefix(f"{prefix}{i}/") for i in range(10)]
        before = [backend.put(f"{prefix}{i}/a", b"before") for i in range(10)]
        for watch, revision in zip(watches, before, strict=True):
            assert [event.revision for event in collect(watch, 1, timeout=5)] == [revision]
        server.stop(graceful=False)
        server.start()
        after = [backend.put(f"{prefix}{i}/b", b"after") for i in range(10)]
        for watch, revision in zip(watches, after, strict=True):
            assert [event.revision for event in collect(watch, 1, timeout=15)] == [revision]
            assert watch.get(timeout=0) == []
            watch.cancel()


def test_a_watch_from_now_while_etcd_is_down_starts_once_it_is_back_or_times_out(start_etcd, prefix):
    server = start_etcd()
    with server.connect(request_timeout=1.0, watch_reconnect_timeout=20) as backend:
        keep = backend.watch_prefix(prefix + "keep/")  # the stream is open
        server.stop(graceful=False)
        started = time.monotonic()
        with pytest.raises(BackendTimeoutError, match="did not confirm the watch"):
            backend.watch_prefix(prefix + "late/")
        assert time.monotonic() - started < 5
        restarter = threading.Timer(0.5, server.start)
        restarter.start()
        try:
            deadline = time.monotonic() + 30
            while True:  # the client retries, as the rendezvous does after a connection error
                try:
                    watch = backend.watch_prefix(prefix + "late/")
                    break
                except BackendTimeoutError:
                    assert time.monotonic() < deadline, "the watch never started after etcd came back"
        finally:
            restarter.join()
        revision = backend.put(prefix + "late/k", b"v")
        assert watch.last_revision < revision
        assert [event.revision for event in collect(watch, 1, timeout=10)] == [revision]
        keep.cancel()
        watch.cancel()


@pytest.mark.slow
def test_watches_created_after_the_streams_auth_token_lapsed_still_work(start_etcd, prefix):
    # etcd checks the Watch stream's token on every create; an unused simple token lapses
    # (--auth-token-ttl, 300 s by default), so a long-lived stream's token goes stale.
    server = start_etcd(auth=True, auth_token_ttl=1)
    with server.connect() as backend:
        first = backend.watch_prefix(prefix + "first/")
        revision = backend.put(prefix + "first/k", b"1")
        assert [event.revision for event in collect(first, 1, timeout=5)] == [revision]
        time.sleep(2.5)  # the token lapses on the server; the stream stays open
        later = backend.watch_prefix(prefix + "later/", start_revision=revision)
        assert collect(later, 1, timeout=0.5) == []  # created (after a re-authentication), not failed
        again = backend.put(prefix + "later/k", b"2")
        assert [event.revision for event in collect(later, 1, timeout=5)] == [again]
        again = backend.put(prefix + "first/k", b"3")  # the watch that was running resumed too
        assert [event.revision for event in collect(first, 1, timeout=5)] == [again]


BLAME = ("grant-permission", "role lacks", "read permission", "password_file", "rejected user")
"""Our advice for a refusal that an operator must fix: never for a token that lapsed."""


@pytest.mark.slow
def test_a_prefix_only_users_lapsed_token_is_renewed_at_debug_and_never_blamed(start_etcd, prefix, caplog):
    # A simple token lapses after --auth-token-ttl unused; etcd 3.4 then refuses a watch create
    # with "invalid auth token", 3.5 with "permission denied", and a unary call with "invalid auth token".
    server = start_etcd(auth=True, auth_token_ttl=1)
    run_lines(job_user_lines("job", prefix), server.endpoints, {JOB_PASSWORD: "pw"},
              login=f"{ROOT_USER}:{server.options.password}")
    caplog.set_level(logging.DEBUG, logger="backends")
    with server.connect(user="job", password="pw") as backend:
        first = backend.watch_prefix(prefix + "first/")
        time.sleep(2.5)  # the token lapses on the server; the stream stays open
        later = backend.watch_prefix(prefix + "later/")  # refused with the lapsed token, created with a new one
        time.sleep(2.5)
        revision = backend.put(prefix + "later/k", b"1")  # the same for a unary call
        assert [event.revision for event in collect(later, 1, timeout=5)] == [revision]
        revision = backend.put(prefix + "first/k", b"2")
        assert [event.revision for event in collect(first, 1, timeout=5)] == [revision]
    renewed = {record.name for record in caplog.records if "authenticating again" in record.getMessage()}
    assert renewed == {"backends.etcd.watch", "backends.etcd.connection"}, caplog.text  # both lapses were met
    loud = [record.getMessage() for record in caplog.records
            if record.levelno >= logging.INFO and "over plain http" not in record.getMessage()]
    assert not loud, loud
    assert not [record.getMessage() for record in caplog.records if any(word in record.getMessage() for word in BLAME)]


def jwt_flags(directory) -> tuple[str, ...]:
    """etcd flags for JWT tokens signed with a fresh RSA key written into ``directory``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private, public = directory / "jwt.key", directory / "jwt.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return (f"--auth-token=jwt,pub-key={public},priv-key={private},sign-method=RS256,ttl=10m",)


def test_a_jwt_token_issued_before_another_user_was_added_is_renewed_not_refused(tmp_path, prefix):
    # A JWT token carries the auth store's revision: once anyone adds a user or changes a role,
    # etcd refuses it ("revision of auth store is old"; 3.5.1: "auth: revision in header is old").
    passwords = {ROOT_PASSWORD: "root-pw", JOB_PASSWORD: "pw"}
    with EtcdCluster(1, extra_args=jwt_flags(tmp_path)) as cluster:
        run_lines(least_privilege_lines("job", prefix), cluster.endpoints(), passwords)
        with EtcdBackend(EtcdConfig(endpoints=cluster.endpoints(), user="job", password="pw")) as backend:
            watch = backend.watch_prefix(prefix + "w/")
            backend.get(prefix + "k")
            run_lines(['etcdctl user add other-tenant --new-user-password="$JOB_PASSWORD"'], cluster.endpoints(),
                      passwords, login="root:root-pw")
            assert backend.get(prefix + "k").kv is None
            revision = backend.put(prefix + "w/k", b"1")
            assert [event.revision for event in collect(watch, 1, timeout=5)] == [revision]
            later = backend.watch_prefix(prefix + "later/", start_revision=revision)
            assert later.get(timeout=0.5) == []  # created, not refused


def test_a_watch_refused_for_permission_fails_alone_after_one_fresh_token(etcd_server, prefix):
    import subprocess

    config = etcd_server.client_config()
    user, role = f"reader-{uuid.uuid4().hex[:6]}", f"role-{uuid.uuid4().hex[:6]}"
    etcdctl = [find_etcdctl_binary(), f"--endpoints={etcd_server.endpoints}", f"--user={config.user}:{config.password}"]
    for args in (["user", "add", f"{user}:pw"], ["role", "add", role],
                 ["role", "grant-permission", role, "--prefix=true", "read", prefix + "allowed/"],
                 ["user", "grant-role", user, role]):
        subprocess.run(etcdctl + args, check=True, capture_output=True, timeout=30)
    with etcd_server.connect(user=user, password="pw") as backend:
        now = backend.get(prefix + "allowed/").revision + 1  # (reading denied/ would be refused at once)
        allowed = backend.watch_prefix(prefix + "allowed/", start_revision=now)
        denied = backend.watch_prefix(prefix + "denied/", start_revision=now)
        with pytest.raises(BackendPermissionError, match="refused.*grant-permission"):
            denied.get(timeout=10)
        assert allowed.get(timeout=0.5) == []  # still running
        assert backend._watch_hub.live_count == 1


def test_renewals_of_many_leases_share_one_keepalive_stream(client):
    leases = [client.grant(5) for _ in range(30)]
    client.keepalive(leases[0].id)
    baseline = threading.active_count()
    with ThreadPoolExecutor(8) as pool:
        ttls = list(pool.map(lambda lease: client.keepalive(lease.id), leases * 3))
    assert all(ttl == 5.0 for ttl in ttls)
    assert threading.active_count() - baseline <= 8  # the pool's threads; no thread per renewal
    client.revoke(leases[1].id)
    with pytest.raises(LeaseNotFoundError):
        client.keepalive(leases[1].id)
    assert client.keepalive(leases[2].id) == 5.0  # the stream survives an unknown lease
    for lease in leases:
        client.revoke(lease.id)


@pytest.mark.slow
def test_keepalive_works_again_after_an_etcd_restart(start_etcd):
    server = start_etcd()
    with server.connect() as backend:
        lease = backend.grant(30)
        assert backend.keepalive(lease.id) == 30.0
        server.stop(graceful=False)
        server.start()
        assert backend.keepalive(lease.id) > 0  # the broken stream is replaced transparently


def test_watching_from_a_compacted_revision_raises_compacted_from_get(client, prefix):
    first = client.put(prefix + "k", b"1")
    last = client.put(prefix + "k", b"2")
    client.compact(last)
    watch = client.watch_prefix(prefix, start_revision=first)
    with pytest.raises(CompactedError) as raised:
        watch.get(timeout=5)
    assert raised.value.requested_revision == first
    assert raised.value.compact_revision == last
    assert "compacted" in str(raised.value)


def test_compacting_twice_to_the_same_revision_is_harmless(client, prefix):
    revision = client.put(prefix + "k", b"1")
    client.compact(revision)
    client.compact(revision)


def test_cancelling_watches_removes_them_on_the_server(etcd_server, client, prefix):
    baseline = watcher_count(etcd_server)
    watches = [client.watch_prefix(f"{prefix}{i}/") for i in range(3)]
    deadline = time.monotonic() + 5
    while watcher_count(etcd_server) < baseline + 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert watcher_count(etcd_server) >= baseline + 3
    for watch in watches:
        watch.cancel()
    deadline = time.monotonic() + 5
    while watcher_count(etcd_server) > baseline and time.monotonic() < deadline:
        time.sleep(0.05)
    assert watcher_count(etcd_server) <= baseline


def test_closing_the_backend_ends_its_watches_and_refuses_calls(etcd_server, prefix):
    backend = etcd_server.connect()
    watch = backend.watch_prefix(prefix)
    backend.close()
    backend.close()
    with pytest.raises(BackendClosedError):
        watch.get(timeout=2)
    with pytest.raises(BackendClosedError):
        backend.put(prefix + "k", b"v")
    with pytest.raises(BackendClosedError):
        backend.watch_prefix(prefix)


# -- endpoints, failover and unreachable servers -----------------------------------------------
def test_failover_skips_a_dead_endpoint_quickly(etcd_server, prefix):
    live = etcd_server.client_config().endpoints[0]
    config = etcd_server.client_config(endpoints=f"127.0.0.1:{dead_port()},{live.netloc}", dial_timeout=3)
    with EtcdBackend(config) as backend:
        started = time.monotonic()
        revision = backend.put(prefix + "k", b"v")
        assert time.monotonic() - started < 1.5
        assert backend.get(prefix + "k").kv.mod_revision == revision
        assert backend.put_if(prefix + "k", b"w", revision).applied
        with backend.watch_prefix(prefix) as watch:
            backend.put(prefix + "j", b"x")
            assert [event.kv.key for event in collect(watch, 1, timeout=5)] == [prefix + "j"]


def test_an_unreachable_etcd_gives_a_connection_error_within_the_dial_timeout():
    port = dead_port()
    with EtcdBackend(EtcdConfig(f"127.0.0.1:{port}", dial_timeout=1.0, request_timeout=1.0)) as backend:
        started = time.monotonic()
        with pytest.raises(BackendConnectionError) as raised:
            backend.get("/k")
        assert time.monotonic() - started < 1.5
        assert f"127.0.0.1:{port}" in str(raised.value)
        assert "connection refused" in str(raised.value)


def test_a_watch_that_cannot_connect_keeps_trying_past_its_reconnect_timeout_until_cancelled(caplog):
    # An outage never ends a watch (the contract: the backend resumes it, however long it
    # takes); the reconnect timeout only spaces the warnings. Cancelling ends it at once.
    config = EtcdConfig(f"127.0.0.1:{dead_port()}", dial_timeout=0.5, request_timeout=0.5, watch_reconnect_timeout=1.0)
    with EtcdBackend(config) as backend:
        watch = backend.watch_prefix("/p/", start_revision=1)
        with caplog.at_level(logging.WARNING, logger="backends.etcd.watch"):
            assert watch.get(timeout=3.5) == []
        assert "keep waiting to resume" in caplog.text
        threading.Timer(0.2, watch.cancel).start()
        started = time.monotonic()
        with pytest.raises(BackendClosedError):
            watch.get(timeout=10)
        assert time.monotonic() - started < 2


def test_a_non_etcd_port_gives_a_clear_protocol_error():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"127.0.0.1:{server.server_address[1]}"
        with EtcdBackend(EtcdConfig(endpoint, dial_timeout=1.0, request_timeout=2.0)) as backend:
            with pytest.raises(ProtocolError) as raised:
                backend.get("/k")
        assert endpoint in str(raised.value) and "not an etcd client URL" in str(raised.value)
    finally:
        server.shutdown()
        server.server_close()


def test_a_silent_tcp_port_gives_a_connection_error_not_a_hang():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
        with EtcdBackend(EtcdConfig(endpoint, dial_timeout=1.0, request_timeout=2.0)) as backend:
            started = time.monotonic()
            with pytest.raises(BackendConnectionError) as raised:
                backend.get("/k")
        assert time.monotonic() - started < 3.5
        assert endpoint in str(raised.value)


@pytest.mark.parametrize(
    "endpoints",
    ["", " , ", "127.0.0.1:99999", "127.0.0.1:port", "ftp://127.0.0.1:2379", "::1", "[::1:2379", "a b:2379"],
)
def test_malformed_endpoints_raise_endpoint_error(endpoints):
    with pytest.raises(EndpointError):
        EtcdBackend(endpoints)


@pytest.mark.parametrize(
    "settings, fragment",
    [
        ({"dial_timeout": 0}, "dial_timeout"),
        ({"request_timeout": -1}, "request_timeout"),
        ({"watch_reconnect_timeout": "soon"}, "watch_reconnect_timeout"),
        ({"user": "root"}, "password"),
        ({"password": "secret"}, "user"),
        ({"client_cert": "/nonexistent.crt"}, "key"),
        ({"ca_cert": "/nonexistent/ca.crt"}, "ca_cert"),
        ({"max_value_bytes": 0}, "max_value_bytes"),
        ({"max_response_bytes": 2**31}, "max_response_bytes"),
        ({"max_response_bytes": True}, "max_response_bytes"),
    ],
)
def test_invalid_settings_are_rejected_eagerly_with_a_sentence(settings, fragment):
    with pytest.raises(EndpointError) as raised:
        EtcdConfig("127.0.0.1:2379", **settings)
    assert fragment in str(raised.value) and str(raised.value).endswith(".")


def test_a_unix_socket_endpoint_carries_reads_writes_watches_and_leases(start_etcd, prefix):
    server = start_etcd(unix_socket=True)
    with EtcdBackend(EtcdConfig(server.unix_endpoint, request_timeout=5.0)) as backend:
        watch = backend.watch_prefix(prefix)
        revision = backend.put(prefix + "k", b"over a unix socket")
        assert backend.get(prefix + "k").kv.mod_revision == revision
        assert [event.revision for event in collect(watch, 1, timeout=5)] == [revision]
        lease = backend.grant(5)
        assert backend.keepalive(lease.id) == 5.0
        watch.cancel()


def test_a_missing_unix_socket_is_one_line_naming_the_path(tmp_path):
    endpoint = f"unix://{tmp_path}/no-etcd.sock"
    with EtcdBackend(EtcdConfig(endpoint, dial_timeout=1.0, request_timeout=2.0)) as backend:
        with pytest.raises(BackendConnectionError) as raised:
            backend.get("/k")
    message = str(raised.value)
    assert f"unix:{tmp_path}/no-etcd.sock" in message and "no unix socket exists" in message and "\n" not in message


def test_tls_settings_with_a_unix_socket_endpoint_are_refused_in_one_sentence(tmp_path):
    with pytest.raises(EndpointError, match="unix: socket"):
        EtcdConfig(f"unix://{tmp_path}/etcd.sock,https://etcd-0:2379")


def test_endpoints_default_to_port_2379_and_https_implies_tls():
    config = EtcdConfig("etcd-0, https://etcd-1:2380")
    assert [(e.host, e.port) for e in config.endpoints] == [("etcd-0", 2379), ("etcd-1", 2380)]
    assert config.tls and not EtcdConfig("etcd-0").tls


# -- auth and TLS ------------------------------------------------------------------------------
def test_a_wrong_password_gives_an_auth_error(etcd_server):
    with etcd_server.connect(password="wrong") as backend:
        with pytest.raises(BackendAuthError) as raised:
            backend.get("/k")
    assert "root" in str(raised.value) and "password" in str(raised.value)


def test_no_credentials_against_an_auth_enabled_etcd_give_an_auth_error(etcd_server):
    with etcd_server.connect(user=None, password=None) as backend:
        with pytest.raises(BackendAuthError):
            backend.get("/k")


def test_tls_with_ca_and_client_certificate_works_and_missing_pieces_give_clear_errors(start_etcd, prefix):
    server = start_etcd(tls=True, client_cert_auth=True)
    with server.connect() as backend:
        revision = backend.put(prefix + "k", b"secret")
        assert backend.get(prefix + "k").kv.mod_revision == revision
        with backend.watch_prefix(prefix) as watch:
            backend.put(prefix + "j", b"x")
            assert len(collect(watch, 1, timeout=5)) == 1
    fast = {"dial_timeout": 1.0, "request_timeout": 2.0}
    with server.connect(ca_cert=None, client_cert=None, client_key=None, **fast) as no_ca:
        with pytest.raises(BackendAuthError) as untrusted:
            no_ca.get("/k")
    assert "cacert=" in str(untrusted.value)
    with server.connect(client_cert=None, client_key=None, **fast) as no_client_cert:
        with pytest.raises(BackendAuthError):
            no_client_cert.get("/k")
    plain = server.endpoints.replace("https://", "")
    with EtcdBackend(EtcdConfig(plain, **fast)) as plaintext:
        with pytest.raises(BackendConnectionError) as refused:
            plaintext.get("/k")
    assert "https://" in str(refused.value)


def rotate_to_a_new_ca(server, tmp_path, agents_ca_file=None):
    """Give etcd a certificate from a new CA (its own CA file rewritten to hold both, and
    ``agents_ca_file`` too if given) and restart it gracefully."""
    rotate_server_ca(server.tls_files, tmp_path / "new-ca", [agents_ca_file] if agents_ca_file else [])
    server.stop(graceful=True)
    server.start()


@pytest.mark.slow
def test_a_rewritten_ca_file_is_read_again_when_etcd_returns_with_a_new_cas_certificate(start_etcd, prefix, tmp_path,
                                                                                       caplog):
    server = start_etcd(client_cert_auth=True)
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(server.tls_files.ca_cert.read_bytes())
    with server.connect(ca_cert=ca_file, watch_reconnect_timeout=20) as backend:
        watch = backend.watch_prefix(prefix)
        before = backend.put(prefix + "before", b"1")
        assert [event.revision for event in collect(watch, 1, timeout=5)] == [before]
        with caplog.at_level(logging.INFO, logger="backends.etcd.tls_files"):
            rotate_to_a_new_ca(server, tmp_path, agents_ca_file=ca_file)
            after = backend.put(prefix + "after", b"2")  # the same client, on a new channel
            assert [event.revision for event in collect(watch, 1, timeout=10)] == [after]
        assert watch.get(timeout=0.5) == []
        watch.cancel()
    assert f"re-read the CA file {ca_file} (changed at " in caplog.text


@pytest.mark.slow
def test_a_failed_handshake_after_a_connection_worked_is_an_outage_until_the_ca_file_holds_the_new_ca(
        start_etcd, prefix, tmp_path):
    server = start_etcd(client_cert_auth=True)
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(server.tls_files.ca_cert.read_bytes())
    with server.connect(ca_cert=ca_file, request_timeout=2, watch_reconnect_timeout=20) as backend:
        watch = backend.watch_prefix(prefix)
        backend.put(prefix + "before", b"1")
        assert len(collect(watch, 1, timeout=5)) == 1
        rotate_to_a_new_ca(server, tmp_path)  # etcd trusts both CAs now; this client only the old one
        with pytest.raises(BackendConnectionError) as outage:  # retried like an outage, not refused for good
            backend.get(prefix + "before")
        assert not isinstance(outage.value, BackendAuthError)
        assert "not signed by the CA this client trusts" in str(outage.value)
        assert f"the CA file {ca_file} (read at " in str(outage.value) and "taken for an outage" in str(outage.value)
        ca_file.write_bytes(server.tls_files.ca_cert.read_bytes())  # the rotation's missing step
        after = backend.put(prefix + "after", b"2")
        assert [event.kv.key for event in collect(watch, 1, timeout=10)] == [prefix + "after"]
        assert backend.get(prefix + "after").kv.mod_revision == after
        watch.cancel()


def test_a_ca_that_never_signed_the_servers_certificate_fails_at_once_naming_the_file(start_etcd, tmp_path):
    server = start_etcd(client_cert_auth=True)
    other = make_tls_files(tmp_path / "other")
    started = time.monotonic()
    with server.connect(ca_cert=other.ca_cert, request_timeout=10) as backend:
        with pytest.raises(BackendAuthError) as refused:
            backend.get("/k")
    assert time.monotonic() - started < 5  # not retried for the request timeout
    assert f"the CA file {other.ca_cert} (read at " in str(refused.value)


def test_dropping_a_stale_token_does_not_wait_for_an_authenticate_call_in_flight():
    # The watch hub's reader drops stale tokens (a watch refused for auth): it must never wait
    # for a caller's Authenticate call in flight.
    from backends.endpoints import Endpoint
    from backends.etcd.connection import EndpointChannel

    channel = EndpointChannel(Endpoint("127.0.0.1", dead_port()), None, ())
    channel.token = "stale"
    channel.forget_token("stale")
    in_call, dropped = threading.Event(), threading.Event()

    def authenticate() -> str:
        in_call.set()
        assert dropped.wait(5), "forget_token blocked behind the Authenticate call"
        return "fresh"

    with ThreadPoolExecutor(1) as pool:
        token = pool.submit(channel.token_or_authenticate, authenticate)
        assert in_call.wait(5)
        channel.forget_token("older")  # from another thread while Authenticate is in flight
        dropped.set()
        assert token.result(timeout=5) == "fresh"
    assert channel.token_or_authenticate(lambda: "unused") == "fresh"
    channel.close()


# -- limits, leases and conditional writes ------------------------------------------------------
def test_values_over_the_client_limit_are_refused_before_sending():
    with EtcdBackend(EtcdConfig(f"127.0.0.1:{dead_port()}", max_value_bytes=10)) as backend:
        with pytest.raises(ValueTooLargeError):
            backend.put("/k", b"x" * 11)
        with pytest.raises(ValueTooLargeError):
            backend.put_if("/k", b"x" * 11, ABSENT)


def test_the_servers_own_request_limit_is_translated(start_etcd, prefix):
    server = start_etcd(max_request_bytes=16 * 1024)
    with server.connect() as backend:
        with pytest.raises(ValueTooLargeError) as raised:
            backend.put(prefix + "big", b"x" * 64 * 1024)
        assert "too large" in str(raised.value)
        assert backend.get(prefix + "big").kv is None


def test_a_prefix_read_above_max_response_bytes_is_refused_and_the_default_holds_thousands_of_joins(
    etcd_server, prefix
):
    # 2000 join-record-sized values (~600 KB in one response): over a 256 KiB limit, well
    # under the default one.
    record = b'{"v":1,"node":"%05d","addr":"10.0.0.1","port":29500,"lws":8,"role":"default"}' + b" " * 180
    with etcd_server.connect() as writer:
        for index in range(2000):
            writer.put(f"{prefix}nodes/{index:05d}", record % index)
    with etcd_server.connect(max_response_bytes=256 * 1024) as small:
        with pytest.raises(ProtocolError) as raised:
            small.get_prefix(prefix)
    assert "max_response_bytes" in str(raised.value) and "\n" not in str(raised.value)
    with etcd_server.connect() as default:
        assert len(default.get_prefix(prefix).kvs) == 2000


def test_lease_ttl_is_rounded_up_to_whole_seconds_and_keepalive_reports_it(client, prefix):
    lease = client.grant(2.2)
    try:
        assert lease.ttl == 3.0
        assert client.keepalive(lease.id) == 3.0
    finally:
        assert client.revoke(lease.id)
    with pytest.raises(LeaseNotFoundError):
        client.keepalive(lease.id)
    with pytest.raises(ValueError):
        client.grant(0)


def test_put_if_reports_the_winner_with_its_create_revision_and_version(client, prefix):
    created = client.put_if(prefix + "k", b"1", ABSENT)
    updated = client.put_if(prefix + "k", b"2", created.revision)
    read = client.get(prefix + "k").kv
    assert updated.current == read
    assert read.create_revision == created.revision and read.version == 2


def test_non_utf8_keys_round_trip(client, prefix):
    key = prefix + b"\xff\xfe".decode("utf-8", "surrogateescape")
    client.put(key, b"v")
    assert [kv.key for kv in client.get_prefix(prefix).kvs] == [key]


def test_prefix_range_end_covers_the_prefix_and_empty_prefix_means_all_keys():
    assert prefix_range_end(b"/a/") == b"/a0"
    assert prefix_range_end(b"a\xff") == b"b"
    assert prefix_range_end(b"") == b"\0"
    assert prefix_range_end(b"\xff\xff") == b"\0"


# -- resending: writes with an unknown outcome are not resent -----------------------------------
@pytest.mark.parametrize("resend_safe, expected_calls", [(True, 2), (False, 1)])
def test_only_resend_safe_requests_are_resent_after_a_timeout(etcd_server, resend_safe, expected_calls):
    connection = EtcdConnection(etcd_server.client_config(request_timeout=3.0))
    calls = []

    def invoke(channel, options):
        calls.append(channel)
        if len(calls) == 1:
            raise FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        return "done"

    try:
        if resend_safe:
            assert connection.call("test", invoke, resend_safe=True) == "done"
        else:
            with pytest.raises(BackendTimeoutError) as raised:
                connection.call("test", invoke, resend_safe=False)
            assert "unknown" in str(raised.value)
    finally:
        connection.close()
    assert len(calls) == expected_calls


def test_requests_never_sent_are_retried_even_when_not_resend_safe(etcd_server):
    connection = EtcdConnection(etcd_server.client_config())
    calls = []

    def invoke(channel, options):
        calls.append(channel)
        if len(calls) == 1:
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: x")
        return "done"

    try:
        assert connection.call("test", invoke, resend_safe=False) == "done"
    finally:
        connection.close()
    assert len(calls) == 2


# -- error translation (pure) ------------------------------------------------------------------
@pytest.mark.parametrize(
    "code, details, expected",
    [
        (
            grpc.StatusCode.UNAVAILABLE,
            "failed to connect to all addresses; last error: Connection refused",
            RequestNotSent,
        ),
        (grpc.StatusCode.UNAVAILABLE, "Socket closed", BackendConnectionError),
        (grpc.StatusCode.UNAVAILABLE, "etcdserver: no leader", BackendConnectionError),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", BackendTimeoutError),
        (grpc.StatusCode.UNAUTHENTICATED, "etcdserver: invalid auth token", BackendAuthError),
        (
            grpc.StatusCode.INVALID_ARGUMENT,
            "etcdserver: authentication failed, invalid user ID or password",
            BackendAuthError,
        ),
        (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: user name is empty", BackendAuthError),
        (grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied", BackendPermissionError),
        (grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found", LeaseNotFoundError),
        (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: request is too large", ValueTooLargeError),
        (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "grpc: received message larger than max (2097160 vs. 2097152)",
            ValueTooLargeError,
        ),
        (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "Stream removed (CLIENT: Received message larger than max (100665116 vs. 4194304))",
            ProtocolError,
        ),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "CLIENT: Sent message larger than max (3145728 vs. 1572864)",
         ValueTooLargeError),
        (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "Stream removed (received metadata size exceeds hard limit (24205 vs. 20480); x-pad-0:8039B)",
            ProtocolError,
        ),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "etcdserver: mvcc: database space exceeded", StoreFullError),
        (grpc.StatusCode.OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted", CompactedError),
        (grpc.StatusCode.UNIMPLEMENTED, "unknown service etcdserverpb.KV", ProtocolError),
        (grpc.StatusCode.CANCELLED, "Cancelled", BackendConnectionError),
        # A TLS etcd stopping gracefully ends open calls without a status (see translate.py).
        (grpc.StatusCode.INTERNAL, "Stream removed (Data frame with END_STREAM flag received) (RST_STREAM (Received "
                                   "RST_STREAM with error code 0))", BackendConnectionError),
        (grpc.StatusCode.UNKNOWN, "Stream removed", BackendConnectionError),
        (grpc.StatusCode.INTERNAL, "grpc: error unmarshalling request: unexpected EOF", BackendError),
        (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: key is not provided", BackendError),
    ],
)
def test_rpc_errors_are_translated_into_the_error_tree(code, details, expected):
    error = translate_rpc_error(FakeRpcError(code, details), operation="put '/k'", endpoint="10.0.0.1:2379", timeout=5)
    assert type(error) is expected
    assert "10.0.0.1:2379" in str(error)


def test_a_full_etcd_is_an_outage_for_writes_whose_message_names_the_fix():
    error = translate_rpc_error(FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "etcdserver: mvcc: database space "
                                             "exceeded"), operation="txn", endpoint="10.0.0.1:2379", timeout=5)
    assert isinstance(error, BackendConnectionError)  # retried like an outage
    for command in ("compact", "defrag", "alarm disarm"):
        assert f"etcdctl --endpoints=10.0.0.1:2379 {command}" in str(error)


def test_a_cancelled_rpc_after_close_is_translated_to_closed():
    error = translate_rpc_error(
        FakeRpcError(grpc.StatusCode.CANCELLED, "Cancelled"), operation="get", endpoint="e", closed=True
    )
    assert isinstance(error, BackendClosedError)


@pytest.mark.parametrize(
    "details, kind",
    [
        (
            "last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused",
            DialFailure.UNREACHABLE,
        ),
        (
            "last error: UNAVAILABLE: Failed parsing HTTP/2 (Expected SETTINGS frame as the first frame)",
            DialFailure.PROTOCOL,
        ),
        ("last error: UNKNOWN: connection attempt timed out before receiving SETTINGS frame", DialFailure.UNREACHABLE),
        ("Tls handshake failed (TSI_PROTOCOL_FAILURE): CERTIFICATE_VERIFY_FAILED", DialFailure.TLS),
        ("last error: UNAVAILABLE: Unwrap failed (TSI_DATA_CORRUPTED)", DialFailure.TLS),
        ("last error: UNAVAILABLE: Handshake read failed (Socket closed)", DialFailure.CLOSED),
        ("last error: UNAVAILABLE: Socket closed", DialFailure.CLOSED),
        (
            "last error: FAILED_PRECONDITION: unix:/x.sock: connect failed: addr: unix:/x.sock error: No such file "
            "or directory",
            DialFailure.UNREACHABLE,
        ),
    ],
)
def test_dial_failures_are_diagnosed(details, kind):
    assert diagnose_dial_failure(details, tls=False).kind is kind


def test_close_returns_only_after_its_reader_threads_left_grpc(etcd_server, prefix):
    # A daemon thread still inside gRPC when the interpreter exits can hang the exit; close()
    # waits for the watch and keepalive readers, so an exit right after it has none left.
    backend = etcd_server.connect()
    watch = backend.watch_prefix(prefix, None)
    lease = backend.grant(5)
    backend.keepalive(lease.id)
    readers = [t for t in threading.enumerate() if t.name == "etcd-watch-hub" or t.name.startswith("etcd-keepalive")]
    assert len(readers) >= 2, [t.name for t in threading.enumerate()]
    backend.close()
    assert [t.name for t in readers if t.is_alive()] == []
    with pytest.raises(BackendClosedError):
        watch.get(timeout=0)


EXIT_RIGHT_AFTER_CLOSE = """
import sys
import grpc
from backends.etcd import EtcdBackend, EtcdConfig

probe = grpc.insecure_channel("127.0.0.1:1")
Channel = type(probe)  # grpcio's concrete channel class
probe.close()
real_close = Channel.close
def close_and_say(channel):
    real_close(channel)
    print("channel closed", flush=True)
Channel.close = close_and_say

endpoints, user, password, prefix = sys.argv[1:5]
backend = EtcdBackend(EtcdConfig(endpoints, user=user or None, password=password or None))
backend.watch_prefix(prefix, None)
backend.keepalive(backend.grant(5).id)
backend.close()
print("backend closed", flush=True)
"""


def test_a_process_that_exits_right_after_close_closes_its_channels_first(etcd_server, prefix):
    # gRPC's channel close needs gRPC's daemon threads; a close still pending when the
    # interpreter finalizes never happens, and the channel goes into finalization open.
    config = etcd_server.client_config()
    argv = [config.endpoint_list, config.user or "", config.password or "", prefix]
    done = subprocess.run([sys.executable, "-c", EXIT_RIGHT_AFTER_CLOSE, *argv], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["backend closed", "channel closed"], (done.stdout, done.stderr[-2000:])
