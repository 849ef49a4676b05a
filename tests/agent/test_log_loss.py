"""Saying that worker output cannot be written: the decisions as a table, then the reporter's lines."""

from __future__ import annotations

import errno
import logging

import pytest

from elastic.agent.processes.log_loss import LogLossReporter, LossState, Say, after_loss, after_write, size_text

EVERY = 60.0
QUIET = LossState()
FAILING_SAID = LossState(failing=True, said=True, last_said=100.0, lost=500)
FAILING_UNSAID = LossState(failing=True, said=False, last_said=100.0, lost=500)
RESUMED_AT_100 = LossState(last_said=100.0)


@pytest.mark.parametrize(
    ("state", "now", "expected"),
    [
        # the first failure ever is said at once
        (QUIET, 5.0, (LossState(True, True, 5.0, 10), Say.FULL)),
        # while it lasts: a reminder once a minute, with the bytes lost so far, else silence
        (FAILING_SAID, 159.0, (LossState(True, True, 100.0, 510), None)),
        (FAILING_SAID, 160.0, (LossState(True, True, 160.0, 510), Say.STILL_FULL)),
        # a new episode right after the last line (writes resumed, then failed again): silent
        # until a minute has passed since that line; then said as a new episode
        (RESUMED_AT_100, 130.0, (LossState(True, False, 100.0, 10), None)),
        (FAILING_UNSAID, 130.0, (LossState(True, False, 100.0, 510), None)),
        (FAILING_UNSAID, 160.0, (LossState(True, True, 160.0, 510), Say.FULL)),
    ],
)
def test_after_loss(state, now, expected):
    assert after_loss(state, 10, now, EVERY) == expected


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (QUIET, (QUIET, None)),  # nothing was lost: nothing to say
        (FAILING_SAID, (LossState(last_said=200.0), Say.RESUMED)),  # the end of a said episode
        (FAILING_UNSAID, (LossState(last_said=100.0), None)),  # never said: its end is not either
    ],
)
def test_after_write(state, expected):
    assert after_write(state, 200.0) == expected


@pytest.mark.parametrize(("nbytes", "text"), [
    (None, "an unknown amount"), (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (4 << 20, "4.0 MiB"),
    (3 << 30, "3.0 GiB"), (5 << 40, "5.0 TiB"), (5 << 50, "5120.0 TiB"),
])
def test_size_text(nbytes, text):
    assert size_text(nbytes) == text


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


FULL = OSError(errno.ENOSPC, "No space left on device")


def test_many_streams_on_one_full_disk_give_one_warning_a_minute_and_one_line_when_it_is_over(tmp_path, caplog):
    clock = Clock()
    reporter = LogLossReporter(clock=clock)
    ranks = [tmp_path / "0", tmp_path / "1"]
    for rank in ranks:
        rank.mkdir()
    with caplog.at_level(logging.INFO, logger="elastic.agent.processes.log_loss"):
        for _ in range(50):  # 2 workers x 2 streams, a line every 0.25 s for 12.5 s
            for rank in ranks:
                reporter.lost(str(rank), 100, FULL)
                reporter.lost(str(rank), 100, FULL)
            clock.now += 0.25
        clock.now += 50  # a minute after the first warning
        reporter.lost(str(ranks[1]), 100, FULL)
        for rank in ranks:
            reporter.written(str(rank))
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 3, lines
    first, reminder, resumed = lines
    assert first.startswith(f"Worker output cannot be written under {ranks[0]} (No space left on device; ")
    assert " free there)" in first and "every 60 s" in first
    assert reminder.startswith(f"Worker output still cannot be written under {ranks[0]}")
    assert reminder.endswith("19.6 KiB lost so far.")  # 201 writes of 100 bytes
    assert resumed.startswith(f"Worker output is written under {ranks[0]} again")
    assert "19.6 KiB were lost meanwhile" in resumed
    assert [record.levelno for record in caplog.records] == [logging.WARNING, logging.WARNING, logging.INFO]


def test_the_repeat_interval_must_be_positive():
    with pytest.raises(ValueError, match=r"The repeat interval \(0\) must be positive\."):
        LogLossReporter(every_s=0)
