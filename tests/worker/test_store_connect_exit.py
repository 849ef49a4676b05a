"""A connect to a round's store left behind for a newer round (elastic/worker/group.py:_connect)
is waited for when the worker closes, so that it does not come back from torch's C++ into a
finalizing interpreter: that aborted a worker that had finished its run (SIGABRT after its last
line, seen once in the live example's end-to-end run). A real TCPStore client in a real process."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.needs_torch

SCRIPT = textwrap.dedent("""
    import sys, time
    from types import SimpleNamespace
    from elastic.worker.errors import Superseded
    from elastic.worker.group import _connect, wait_for_connects
    from elastic.worker.options import LiveOptions
    from elastic.worker.rounds import Round

    port, timeout, wait = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    round_ = Round(round=1, rank=0, world_size=2, local_rank=0, local_world_size=1, group_rank=0,
                   master_addr="127.0.0.1", master_port=port, restart_count=0, store_prefix="r1")
    mailbox = SimpleNamespace(pending=object())  # a newer round is already waiting
    began = time.monotonic()
    try:
        _connect(round_, LiveOptions(store_timeout=timeout), mailbox, time.monotonic)
    except Superseded:
        print("superseded", flush=True)
    print(wait_for_connects(wait), round(time.monotonic() - began, 2), flush=True)
""")


def run(port: int, timeout: float, wait: float) -> tuple[int, float]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(port), str(timeout), str(wait)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.split()
    assert lines[0] == "superseded", done.stdout
    return int(lines[1]), float(lines[2])


def test_a_connect_left_behind_to_a_store_that_is_gone_is_waited_for_until_it_ends():
    gone = socket.socket()
    gone.bind(("127.0.0.1", 0))
    port = gone.getsockname()[1]
    gone.close()  # nothing listens: the client retries until its timeout
    running, took = run(port, timeout=1.0, wait=20.0)
    assert running == 0
    assert 1.0 <= took < 20.0


def test_a_connect_left_behind_to_a_frozen_store_is_waited_for_no_longer_than_asked():
    # A listener that never answers (a frozen master: the kernel still accepts): the client's
    # handshake never ends; the wait gives up and the program still ends.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        running, took = run(silent.getsockname()[1], timeout=1.0, wait=3.0)
    finally:
        silent.close()
    assert running == 1
    assert 3.0 <= took < 20.0
