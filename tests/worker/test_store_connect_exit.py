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
    from elastic.worker.group import _connect
    from elastic.worker.leftover import wait_for_leftovers
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
    print(wait_for_leftovers(wait), round(time.monotonic() - began, 2), flush=True)
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


LOOK_SCRIPT = textwrap.dedent("""
    import sys, threading, time
    from datetime import timedelta
    import torch.distributed as dist
    from elastic.worker.collectives import GroupInUse
    from elastic.worker.options import LiveOptions
    from elastic.worker.recoverer import _drain
    from elastic.worker.regroup import within

    timeout = float(sys.argv[1])
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    client = dist.TCPStore("127.0.0.1", master.port, is_master=False, wait_for_workers=False,
                           timeout=timedelta(seconds=timeout))
    print(within(0.05, lambda: client.get("never-set"), "a look at a key that never comes", "test"), flush=True)
    began = time.monotonic()
    _drain(GroupInUse("test"), LiveOptions(store_timeout=timeout), False, "test")
    looks = sum(thread.name == "elastic-store-look" for thread in threading.enumerate())
    print(looks, round(time.monotonic() - began, 2), flush=True)
""")


def test_a_bounded_look_at_a_store_left_behind_is_waited_for_when_the_worker_closes():
    # The look (elastic/worker/regroup.py:within) gives up after 0.05 s; its store call runs on
    # until the client's 1 s timeout. Closing (the recoverer's drain) waits for it to end.
    done = subprocess.run([sys.executable, "-c", LOOK_SCRIPT, "1.0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    given_up, (running, took) = done.stdout.split()[0], done.stdout.split()[1:3]
    assert given_up == "None", done.stdout
    assert int(running) == 0, done.stdout
    assert float(took) < 20.0
