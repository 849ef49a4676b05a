"""The round pipe: line splitting, the mailbox, and the watcher thread on a real pipe."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest

from elastic.worker.channel import LineSplitter, Overlong, RoundMailbox, RoundWatcher
from elastic.worker.decisions import RoundAction
from elastic.worker.rounds import Round, encode_round_line


def _round(number: int) -> Round:
    return Round(number, 0, 2, 0, 1, 0, "127.0.0.1", 29500, 0, f"p/{number}")


@pytest.mark.parametrize(
    ("chunks", "limit", "items"),
    [
        ([b"a\nb\n"], 10, [b"a", b"b"]),
        ([b"ab", b"c\n"], 10, [b"abc"]),  # a line split across reads
        ([b"abc"], 10, []),  # no newline yet
        ([b"\n\n  \n"], 10, []),  # blank lines are skipped
        ([b"x" * 11 + b"\nok\n"], 10, [Overlong(11), b"ok"]),
        ([b"x" * 6, b"x" * 6, b"xx\nok\n"], 10, [Overlong(14), b"ok"]),  # over the bound across reads
        ([b"x" * 10 + b"\n"], 10, [b"x" * 10]),  # exactly the bound
    ],
)
def test_line_splitter(chunks, limit, items):
    splitter = LineSplitter(limit)
    out = []
    for chunk in chunks:
        out.extend(splitter.feed(chunk))
    assert out == items


def test_the_mailbox_keeps_the_newest_round_and_hands_it_over_once():
    mailbox = RoundMailbox(current=3)
    assert mailbox.offer(_round(5), 1.0) is RoundAction.NEWER
    assert mailbox.offer(_round(4), 2.0) is RoundAction.RENUMBERED  # the rendezvous numbered anew: it replaces 5
    assert mailbox.pending.record.round == 4
    assert mailbox.offer(_round(6), 3.0) is RoundAction.NEWER
    arrival = mailbox.take()
    assert (arrival.record.round, arrival.at, mailbox.current, mailbox.pending) == (6, 3.0, 6, None)
    assert mailbox.take() is None
    assert mailbox.offer(_round(6), 4.0) is RoundAction.REPEAT
    # The same number with another store: the rendezvous numbered anew and reached it again.
    other = Round(6, 0, 2, 0, 1, 0, "127.0.0.1", 29501, 0, "p/6")
    assert mailbox.offer(other, 5.0) is RoundAction.RENUMBERED and mailbox.take().record == other


def test_mailbox_wait_wakes_on_a_round_and_on_eof():
    mailbox = RoundMailbox(current=0)
    threading.Timer(0.05, lambda: mailbox.offer(_round(1), 0.0)).start()
    started = time.monotonic()
    mailbox.wait(5.0)
    assert mailbox.pending is not None and time.monotonic() - started < 2.0
    mailbox.take()
    threading.Timer(0.05, mailbox.close).start()
    mailbox.wait(5.0)
    assert mailbox.eof


class _Registry:
    def __init__(self) -> None:
        self.calls: list[tuple[float, int]] = []

    def interrupt_older_than(self, cutoff: float, round_number: int) -> int:
        self.calls.append((cutoff, round_number))
        return 1


@pytest.fixture
def pipe_watcher():
    made = []

    def make(registry=None, grace=0.2):
        read_fd, write_fd = os.pipe()
        mailbox = RoundMailbox(current=0, store=("127.0.0.1", 29500))  # the store of _round(0)
        watcher = RoundWatcher(read_fd, mailbox, lambda: registry, grace, "run t pid 1")
        watcher.start()
        made.append((watcher, write_fd))
        return watcher, mailbox, write_fd

    yield make
    for watcher, write_fd in made:
        watcher.stop()
        try:
            os.close(write_fd)
        except OSError:
            pass


def _until(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.01)


def test_the_watcher_ignores_garbage_with_one_warning_each_and_reads_the_next_round(pipe_watcher, caplog):
    caplog.set_level(logging.WARNING, logger="elastic.worker.channel")
    _, mailbox, write_fd = pipe_watcher()
    os.write(write_fd, b"garbage\n{\"v\": 1}\n" + b"y" * 70_000 + b"\n")
    os.write(write_fd, encode_round_line(_round(0)))  # a repeat: quiet
    os.write(write_fd, encode_round_line(_round(2))[:20])
    time.sleep(0.05)
    assert mailbox.pending is None
    os.write(write_fd, encode_round_line(_round(2))[20:])
    _until(lambda: mailbox.pending is not None)
    assert mailbox.pending.record == _round(2)
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 3, messages
    assert all("run t pid 1" in message for message in messages)
    assert sum("ignored a bad line" in message for message in messages) == 2
    assert sum("over the 65536-byte limit" in message for message in messages) == 1


def test_the_watcher_reports_eof_as_the_agent_gone(pipe_watcher, caplog):
    _, mailbox, write_fd = pipe_watcher()
    os.close(write_fd)
    _until(lambda: mailbox.eof)
    assert "reached EOF" in caplog.text


def test_a_pending_round_interrupts_collectives_older_than_the_grace(pipe_watcher):
    registry = _Registry()
    _, mailbox, write_fd = pipe_watcher(registry, grace=0.2)
    time.sleep(0.1)
    assert registry.calls == []  # nothing pending: nothing interrupted
    os.write(write_fd, encode_round_line(_round(1)))
    _until(lambda: registry.calls)
    cutoff, number = registry.calls[0]
    assert number == 1 and cutoff <= time.monotonic() - 0.2
    mailbox.take()
    count = len(registry.calls)
    time.sleep(0.1)
    assert len(registry.calls) <= count + 1  # once taken, the watcher stops polling


def test_stop_closes_the_pipe_and_ends_the_thread(pipe_watcher):
    watcher, _, write_fd = pipe_watcher()
    watcher.stop()
    with pytest.raises(BrokenPipeError):
        os.write(write_fd, b"x\n")
