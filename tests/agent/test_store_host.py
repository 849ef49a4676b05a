"""The master port listens from the join on, and the store helper serves a TCPStore on it.

Real sockets, a real helper process (it imports torch) and real torch TCPStore clients.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import threading
import time

import pytest

from elastic.agent.processes.store_host import StoreHost, StoreHostError
from elastic.rendezvous.ports import reserve_port

pytestmark = pytest.mark.slow


def test_a_reserved_port_accepts_connections_before_anyone_serves_it():
    reservation = reserve_port("127.0.0.1")
    try:
        with socket.create_connection(("127.0.0.1", reservation.port), timeout=2):
            pass  # queued by the kernel, not refused
    finally:
        reservation.close()
    assert reservation.take() is None  # closed: nothing left to hand over


@pytest.mark.needs_torch
def test_workers_that_connect_before_the_helper_serves_are_served_once_it_does():
    import torch.distributed as dist

    host = StoreHost(sys.executable, os.environ)
    reservation = reserve_port("127.0.0.1")
    port = reservation.port
    results: list[float] = []

    def client() -> None:
        started = time.monotonic()
        store = dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=30), wait_for_workers=False)
        store.set(f"k{threading.get_ident()}", "v")
        results.append(time.monotonic() - started)

    threads = [threading.Thread(target=client) for _ in range(4)]
    try:
        for thread in threads:
            thread.start()  # before the helper even exists
        time.sleep(0.3)
        host.serve(reservation.take(), "127.0.0.1")  # the helper imports torch first: about a second or two
        for thread in threads:
            thread.join(timeout=60)
        assert len(results) == 4, "a client was refused or timed out"
        host.poll()
        deadline = time.monotonic() + 10
        while host.serving != port and time.monotonic() < deadline:
            time.sleep(0.05)
            host.poll()
        assert host.serving == port
        # A released store closes its port; the warm helper serves the next attempt's at once.
        host.release()
        nxt = reserve_port("127.0.0.1")
        next_port = nxt.port
        host.serve(nxt.take(), "127.0.0.1")
        dist.TCPStore("127.0.0.1", next_port, None, False, datetime.timedelta(seconds=10), wait_for_workers=False)
    finally:
        proc = host._proc
        host.close()
    assert proc is not None and proc.poll() is not None  # the helper exits when its pair closes


def test_the_store_of_the_attempt_before_answers_until_the_next_hand_over():
    # A live worker leaving round r for round r+1 ends round r's generations in round r's store
    # (elastic.worker.refill.leave_round); the master's agent has handed round r+1's port over by then.
    import torch.distributed as dist

    host = StoreHost(sys.executable, os.environ)
    reservations = [reserve_port("127.0.0.1") for _ in range(3)]
    try:
        host.serve(reservations[0].take(), "127.0.0.1")
        first = dist.TCPStore("127.0.0.1", reservations[0].port, None, False, datetime.timedelta(seconds=30),
                              wait_for_workers=False)
        first.set("k", "r0")
        host.serve(reservations[1].take(), "127.0.0.1")
        dist.TCPStore("127.0.0.1", reservations[1].port, None, False, datetime.timedelta(seconds=30),
                      wait_for_workers=False)  # the next attempt's store is served ...
        time.sleep(1.0)  # (a dropped store's server stops in the background, within a few tenths of a second)
        assert first.get("k") == b"r0"  # ... and the one before still answers
        host.serve(reservations[2].take(), "127.0.0.1")
        deadline = time.monotonic() + 30
        while host.serving != reservations[2].port and time.monotonic() < deadline:
            time.sleep(0.05)
            host.poll()
        with pytest.raises(RuntimeError):  # two hand-overs later it is gone (its server stops in the background)
            while time.monotonic() < deadline:
                first.set("k", "r2")
                time.sleep(0.05)
    finally:
        host.close()


def test_a_helper_that_cannot_start_is_a_store_host_error_and_the_socket_is_closed(tmp_path):
    host = StoreHost(str(tmp_path / "no-such-python"), os.environ)
    reservation = reserve_port("127.0.0.1")
    listener = reservation.take()
    with pytest.raises(StoreHostError, match="could not take port"):
        host.serve(listener, "127.0.0.1")
    assert listener.fileno() == -1  # closed: rank 0's worker may bind the port itself


def test_closing_a_helper_that_still_imports_torch_kills_it_at_once(tmp_path):
    """The agent's exit does not wait out the helper's torch import: it serves nothing yet."""
    slow = tmp_path / "slow-torch"
    (slow / "torch" / "distributed").mkdir(parents=True)
    (slow / "torch" / "__init__.py").write_text("import time\ntime.sleep(60)\n")
    host = StoreHost(sys.executable, dict(os.environ, PYTHONPATH=str(slow)))
    host.warm()
    proc = host._proc
    reservation = reserve_port("127.0.0.1")
    host.serve(reservation.take(), "127.0.0.1")  # handed over mid-import: it waits unread
    time.sleep(0.3)
    started = time.monotonic()
    host.close()
    assert time.monotonic() - started < 1.0  # not the 2 s a ready helper gets to exit
    assert proc is not None and proc.returncode is not None  # killed and reaped: no orphan


@pytest.mark.needs_torch
def test_a_helper_serving_a_store_stops_it_and_exits_by_itself_when_closed():
    import torch.distributed as dist

    host = StoreHost(sys.executable, os.environ)
    reservation = reserve_port("127.0.0.1")
    port = reservation.port
    try:
        host.serve(reservation.take(), "127.0.0.1")
        dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=60), wait_for_workers=False)
        deadline = time.monotonic() + 30
        while host.serving != port and time.monotonic() < deadline:
            time.sleep(0.05)
            host.poll()
        assert host.serving == port
    finally:
        proc = host._proc
        host.close()
    assert proc is not None and proc.returncode == 0  # left on its own (EOF), not killed
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # its store stopped with it
