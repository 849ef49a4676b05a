"""Finding 10 of round three: the built-in store bounds an authenticated peer too, and a flood of
bad connections neither floods its log nor stalls its clients.

The process tests run ``elastic-store`` in its own process on loopback (as
:mod:`test_store_bounds`) and measure its resident memory (VmRSS) while a client with the token
replays the review's reproducers: lease-grant spam, renewals behind a lease at the top of the
expiry heap, 150 live 1 MiB keys; then garbage connections with the store's stderr a pipe
nobody reads, while a well-behaved client keeps writing. Unit tests pin the bookkeeping.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time

import pytest

from backends.errors import LimitExceededError
from backends.kvstate import KEY_OVERHEAD_BYTES, KVState, StateLimits
from backends.tcp.client import TcpStoreBackend
from backends.tcp.config import TcpStoreConfig
from backends.tcp.peerlog import PeerLog
from backends.txn import Delete, Put, Txn
from hostile import StoreProcess

MiB = 1024 * 1024


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(secrets.token_hex(16))
    return path


def client(store: StoreProcess, token_file, timeout: float = 30.0) -> TcpStoreBackend:
    config = TcpStoreConfig(f"127.0.0.1:{store.port}", token=token_file.read_text(), request_timeout=timeout)
    return TcpStoreBackend(config).connect()


def for_seconds(seconds: float, step) -> tuple[int, list[Exception]]:
    ok, errors = 0, []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            step()
            ok += 1
        except LimitExceededError as error:
            errors.append(error)
    return ok, errors


# -- the state's bookkeeping ---------------------------------------------------------------------


def test_grants_beyond_the_lease_limit_are_refused_naming_the_flag_and_freed_leases_count_again():
    state = KVState(limits=StateLimits(max_leases=3))
    leases = [state.grant(60) for _ in range(3)]
    with pytest.raises(LimitExceededError, match="3 live leases.*--max-leases"):
        state.grant(60)
    state.revoke(leases[0].id)
    state.grant(60)


def test_renewals_behind_a_lease_that_is_never_renewed_keep_the_expiry_heap_bounded():
    now = [0.0]
    state = KVState(clock=lambda: now[0])
    state.grant(3600)  # the top of the heap for an hour
    renewed = state.grant(7200).id
    churn = [state.grant(5000).id for _ in range(10)]
    for step in range(100_000):
        now[0] += 0.001
        state.keepalive(renewed)
        if step % 1000 == 0 and churn:
            state.revoke(churn.pop())
    assert state._leases.heap_size <= 2 * 2 + 1024 + 1  # main: 100,012 entries
    assert state.next_expiry() == pytest.approx(3600)
    now[0] = 3600.5
    assert state.expire_due() == () and state.next_expiry() == pytest.approx(100 + 7200, abs=1)


def test_live_bytes_follow_puts_overwrites_deletes_and_expiry_and_bound_writes():
    now = [0.0]
    limit = 3 * (KEY_OVERHEAD_BYTES + 2 + 100)
    state = KVState(clock=lambda: now[0], limits=StateLimits(max_live_bytes=limit))
    lease = state.grant(10).id
    state.put("/a", b"x" * 100)
    state.put("/b", b"x" * 100, lease)
    assert state.live_bytes == 2 * (KEY_OVERHEAD_BYTES + 2 + 100)
    state.put("/a", b"x" * 50)  # an overwrite counts the difference
    assert state.live_bytes == 2 * (KEY_OVERHEAD_BYTES + 2) + 150
    state.put("/c", b"x" * 150)
    with pytest.raises(LimitExceededError, match="--max-live-bytes"):
        state.put("/d", b"x")
    with pytest.raises(LimitExceededError):  # a transaction is refused whole: nothing written
        state.txn(Txn((), (Put("/a", b"y"), Put("/e", b"y" * 100))))
    assert state.get("/a").kv.value == b"x" * 50 and state.get("/e").kv is None
    state.delete("/c")
    state.txn(Txn((), (Put("/e", b"y" * 100), Delete("/a"))))
    now[0] = 11
    state.expire_due()  # /b's lease expires
    assert state.live_bytes == KEY_OVERHEAD_BYTES + 2 + 100  # /e alone
    state.put("/e", b"z" * 300)  # shrinking or growing within the bound is fine
    assert state.live_bytes == KEY_OVERHEAD_BYTES + 2 + 300


# -- the peer log --------------------------------------------------------------------------------


class Recorder(logging.Handler):
    def __init__(self, block: threading.Event | None = None) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.block = block

    def emit(self, record: logging.LogRecord) -> None:
        if self.block is not None:
            self.block.wait()
        self.lines.append(record.getMessage())


def _logger(handler: logging.Handler) -> logging.Logger:
    logger = logging.getLogger(f"peerlog-test-{id(handler)}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    return logger


def test_the_peer_log_writes_one_line_per_kind_per_interval_and_counts_the_rest():
    now = [0.0]
    recorder = Recorder()
    peer_log = PeerLog(_logger(recorder), interval=10, clock=lambda: now[0])
    for _ in range(1000):
        peer_log.note("handshake", logging.WARNING, "dropping %s", "peer")
    peer_log.note("auth", logging.WARNING, "wrong token")
    now[0] = 10.5
    peer_log.note("handshake", logging.WARNING, "dropping %s", "peer")
    peer_log.close()
    assert recorder.lines == ["dropping peer", "wrong token", "dropping peer (and 999 more like it in the last 10 s)"]


def test_the_peer_log_never_blocks_its_caller_on_a_stuck_writer():
    stuck = threading.Event()
    recorder = Recorder(block=stuck)
    now = [0.0]
    peer_log = PeerLog(_logger(recorder), interval=1, clock=lambda: now[0])
    started = time.monotonic()
    for index in range(10_000):
        now[0] += 2  # every line is due: only the queue bounds them
        peer_log.note("handshake", logging.WARNING, "line %d", index)
    assert time.monotonic() - started < 2.0
    stuck.set()
    deadline = time.monotonic() + 5
    while len(recorder.lines) < 64 and time.monotonic() < deadline:
        time.sleep(0.01)
    now[0] += 2
    peer_log.note("handshake", logging.WARNING, "after")
    peer_log.close(timeout=5)
    assert len(recorder.lines) <= 70  # what the queue held, not 10,000 lines
    assert recorder.lines[-1].startswith("after") and "earlier log lines dropped" in recorder.lines[-1]


# -- a real store, a hostile authenticated peer --------------------------------------------------


@pytest.mark.slow
def test_lease_grant_spam_is_refused_at_the_lease_limit_and_costs_little(token_file):
    with StoreProcess(token_file=token_file) as store, client(store, token_file) as peer:
        before = store.rss_bytes()
        granted, refused = for_seconds(10, lambda: peer.grant(3600))
        grown = store.rss_bytes() - before
    assert granted == 10_000 and refused, (granted, len(refused))
    assert "--max-leases" in str(refused[0])
    assert grown < 16 * MiB, f"the store grew by {grown / MiB:.0f} MiB (main: +45 MiB in 10 s)"


@pytest.mark.slow
def test_renewal_spam_behind_an_unrenewed_lease_leaves_the_store_flat(token_file):
    with StoreProcess(token_file=token_file) as store, client(store, token_file) as peer:
        peer.grant(3600)
        renewed = peer.grant(7200).id
        before = store.rss_bytes()
        renewals, _ = for_seconds(10, lambda: peer.keepalive(renewed))
        grown = store.rss_bytes() - before
    assert renewals > 1000
    assert grown < 6 * MiB, f"the store grew by {grown / MiB:.0f} MiB after {renewals} renewals (main: +18 MiB)"


@pytest.mark.slow
def test_150_live_1_mib_keys_stop_at_the_live_bytes_limit(token_file):
    with StoreProcess(token_file=token_file) as store, client(store, token_file) as peer:
        before = store.rss_bytes()
        stored, refused = 0, []
        for index in range(150):
            try:
                peer.put(f"/big/{index}", bytes([index % 256]) * MiB)
                stored += 1
            except LimitExceededError as error:
                refused.append(error)
        grown = store.rss_bytes() - before
        peer.delete_prefix("/big/")
        assert peer.put("/big/again", b"x" * MiB) > 1  # freed bytes count again
    assert stored == 63 and len(refused) == 87 and "--max-live-bytes" in str(refused[0])
    assert grown < 100 * MiB, f"the store grew by {grown / MiB:.0f} MiB (main: +153 MiB)"


def _garbage(port: int, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        except OSError:
            time.sleep(0.001)


@pytest.mark.slow
def test_a_bad_connection_flood_with_an_unread_stderr_stalls_no_client_and_logs_a_few_lines(token_file):
    with StoreProcess("--log-level", "INFO", token_file=token_file) as store:  # stderr: a pipe, unread
        stop = threading.Event()
        flooders = [threading.Thread(target=_garbage, args=(store.port, stop), daemon=True) for _ in range(4)]
        for thread in flooders:
            thread.start()
        latencies, failures = [], []
        try:
            with client(store, token_file, timeout=2.0) as good:
                end = time.monotonic() + 15
                while time.monotonic() < end:
                    started = time.monotonic()
                    try:
                        good.put("/good", b"1")
                        latencies.append(time.monotonic() - started)
                    except Exception as error:  # noqa: BLE001 - a timeout is the failure measured
                        failures.append(error)
                    time.sleep(0.05)
        finally:
            stop.set()
            for thread in flooders:
                thread.join()
        log = store.stderr()
    assert failures == [] and max(latencies) < 1.0, (failures[:3], max(latencies, default=None))
    lines = log.splitlines()
    assert 1 <= len(lines) < 40, f"{len(lines)} lines: {lines[:5]}"  # main: a line per connection
    assert any("more like it" in line for line in lines) or len(lines) <= 3
