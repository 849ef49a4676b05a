"""Nodes start in any order: a node keeps trying a built-in store that is not up yet.

The waiting lines and the failure are pure (case tables); :func:`wait_for_store` runs on a fake
clock and sleep; :func:`open_backend` against a real in-process store that starts late, and
one that refuses our token.
"""

from __future__ import annotations

import errno
import threading
import time

import pytest

from backends.errors import BackendAuthError, BackendConnectionError, BackendTimeoutError, ProtocolError
from backends.endpoints import Endpoint
from backends.retry import RetryPolicy
from backends.tcp.server import start_server
from elastic.rendezvous.backend_spec import Hosting, Secret, StoreSpec
from elastic.rendezvous.errors import RendezvousConnectionError
from elastic.rendezvous.registry import open_backend, store_fix, store_subject
from elastic.rendezvous.store_wait import StoreWait, gave_up_message, short_reason, wait_for_store, waiting_line
from elastic.testing.ports import free_port


class FakeTime:
    """A clock that only the fake sleep moves."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def refused() -> BackendConnectionError:
    error = BackendConnectionError("Cannot connect to the elastic-store at h:1: [Errno 111] Connection refused.")
    error.__cause__ = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
    return error


def a_wait(fake: FakeTime, timeout: float = 60.0) -> StoreWait:
    policy = RetryPolicy(max_attempts=2**31, initial_backoff=1.0, max_backoff=1.0, jitter=0.0,
                         sleep=fake.sleep, clock=fake.clock)
    return StoreWait("job-1", "node-b", timeout, policy)


# -- the lines ---------------------------------------------------------------------------------


def test_the_waiting_line_names_the_run_the_node_what_it_waits_for_why_and_the_time_left():
    assert waiting_line("job-1", "node-b", "the c10d store host at h:29400 (is_host=0)", "connection refused",
                        594.6) == ("Rendezvous job-1 (node node-b): waiting for the c10d store host at h:29400 "
                                   "(is_host=0): connection refused; 595 s left before the join timeout")
    assert waiting_line("r", "n", "the elastic-store at h:1", "x", -3).endswith("; 0 s left before the join timeout")


def test_giving_up_is_one_line_naming_the_endpoint_and_the_fix():
    message = gave_up_message("job-1", "node-b", "the elastic-store at h:1", "connection refused", 600,
                              "Start it (elastic-store --host h --port 1) or fix --rdzv-endpoint")
    assert message == ("Rendezvous job-1 (node node-b): the elastic-store at h:1 did not answer within the join "
                       "timeout (600s): connection refused. Start it (elastic-store --host h --port 1) or fix "
                       "--rdzv-endpoint; to wait longer, raise --rdzv-conf join_timeout.")
    assert "\n" not in message


@pytest.mark.parametrize("error, expected", [
    (refused(), "connection refused"),
    (BackendTimeoutError("The peer at h:1 did not complete the handshake in time."),
     "The peer at h:1 did not complete the handshake in time"),
])
def test_the_reason_is_the_socket_error_when_there_is_one(error, expected):
    assert short_reason(error) == expected


def spec(name: str, hosting: Hosting = Hosting.CONNECT, host: str = "10.0.0.5") -> StoreSpec:
    return StoreSpec(name, Endpoint(host, 29555), hosting=hosting)


@pytest.mark.parametrize("store, host_failed, subject", [
    (spec("c10d"), False, "the c10d store host at 10.0.0.5:29555 (is_host=0)"),
    (spec("c10d", Hosting.BY_ADDRESS), False, "the c10d store host at 10.0.0.5:29555 (10.0.0.5 is not this node's address)"),
    (spec("c10d", Hosting.BY_ADDRESS), True,
     "the c10d store host at 10.0.0.5:29555 (its port is taken on this node: another process hosts it)"),
    (spec("tcp"), False, "the elastic-store at 10.0.0.5:29555"),
])
def test_the_subject_says_why_this_node_does_not_host_the_store(store, host_failed, subject):
    assert store_subject(store, host_failed) == subject


def test_the_fix_names_how_to_start_the_store():
    assert store_fix(spec("tcp")) == "Start it (elastic-store --host 10.0.0.5 --port 29555) or fix --rdzv-endpoint"
    assert store_fix(spec("c10d")) == ("Start the node that hosts it (the one whose address is 10.0.0.5, or with "
                                       "--rdzv-conf is_host=1) or fix --rdzv-endpoint")


# -- the wait ----------------------------------------------------------------------------------


def test_a_refused_store_is_tried_again_until_it_answers_with_a_line_at_first_and_every_ten_seconds():
    fake = FakeTime()
    failures = [refused() for _ in range(25)]
    lines: list[str] = []

    def connect() -> None:
        if failures:
            raise failures.pop()

    wait_for_store(connect, "the c10d store host at h:1 (is_host=0)", "fix it", a_wait(fake), lines.append)
    assert not failures and len(fake.sleeps) == 25  # one try a second
    assert [line.rsplit("; ", 1)[1] for line in lines] == [
        "60 s left before the join timeout", "50 s left before the join timeout", "40 s left before the join timeout"]
    assert all("waiting for the c10d store host at h:1 (is_host=0): connection refused" in line for line in lines)


def test_a_store_that_never_comes_fails_after_the_join_timeout_with_the_last_error_as_cause():
    fake = FakeTime()
    last = []

    def connect() -> None:
        last.append(refused())
        raise last[-1]

    with pytest.raises(RendezvousConnectionError) as raised:
        wait_for_store(connect, "the elastic-store at h:1", "Start it", a_wait(fake, timeout=12), lambda _: None)
    assert fake.now - 100.0 <= 12
    assert str(raised.value).startswith("Rendezvous job-1 (node node-b): the elastic-store at h:1 did not answer "
                                        "within the join timeout (12s): connection refused. Start it;")
    assert raised.value.__cause__ is last[-1]


@pytest.mark.parametrize("error", [BackendAuthError("wrong token"), ProtocolError("not an elastic-store")])
def test_a_store_that_refuses_us_is_not_waited_for(error):
    fake = FakeTime()
    calls = []

    def connect() -> None:
        calls.append(1)
        raise error

    with pytest.raises(type(error)):
        wait_for_store(connect, "the elastic-store at h:1", "Start it", a_wait(fake), lambda _: None)
    assert calls == [1] and fake.sleeps == []


def test_the_wait_needs_a_positive_timeout():
    with pytest.raises(ValueError, match="timeout"):
        StoreWait("r", "n", 0)


# -- open_backend against a real store ---------------------------------------------------------


def test_a_node_started_before_its_store_connects_once_the_store_listens():
    port = free_port()
    started: list = []

    def start_later() -> None:
        time.sleep(1.5)
        started.append(start_server("127.0.0.1", port, "s3cret"))

    thread = threading.Thread(target=start_later)
    thread.start()
    begun = time.monotonic()
    try:
        opened = open_backend(StoreSpec("tcp", Endpoint("127.0.0.1", port), token=Secret("token", "s3cret")),
                              StoreWait("job-1", "node-b", 30.0))
        try:
            assert opened.backend.put("/k", b"v") > 0
        finally:
            opened.release()
        assert 1.5 <= time.monotonic() - begun < 10
    finally:
        thread.join()
        for server in started:
            server.stop()


def test_a_store_that_refuses_our_token_fails_at_once_however_long_the_wait():
    server = start_server("127.0.0.1", 0, "right")
    try:
        begun = time.monotonic()
        with pytest.raises(RendezvousConnectionError, match="token"):
            open_backend(StoreSpec("tcp", Endpoint("127.0.0.1", server.port), token=Secret("token", "wrong")),
                         StoreWait("job-1", "node-b", 600.0))
        assert time.monotonic() - begun < 5
    finally:
        server.stop()


def test_without_a_wait_a_store_that_is_not_up_fails_at_once():
    with pytest.raises(RendezvousConnectionError, match="connection refused"):
        open_backend(StoreSpec("tcp", Endpoint("127.0.0.1", free_port())))
