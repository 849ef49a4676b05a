"""Where a worker's streams go: the routing decision as a table, then its files and pumps."""

from __future__ import annotations

import errno
import io
import logging
import os
import subprocess
import sys
import time

import pytest

from elastic.agent.processes import output as output_module
from elastic.agent.processes.output import (
    Console, Pump, RankDest, Sink, StreamRoute, WorkerLogs, WorkerOutput, console_kind, route_dest, route_stream,
)

FD, STREAM, NONE = Console.FD, Console.STREAM, Console.NONE
PUMPED_TEE = StreamRoute(Sink.PIPE, logged=True, prefixed=True)
FILE = StreamRoute(Sink.FILE, logged=True)
DISCARD = StreamRoute(Sink.DEVNULL)


@pytest.mark.parametrize(
    ("redirect", "tee", "shown", "console", "expected"),
    [
        # neither: the console as is, or nothing for a filtered-out rank
        (False, False, True, FD, StreamRoute(Sink.INHERIT)),
        (False, False, True, STREAM, StreamRoute(Sink.PIPE)),  # no fd to inherit: pumped, no prefix
        (False, False, True, NONE, DISCARD),
        (False, False, False, FD, DISCARD),
        (False, False, False, STREAM, DISCARD),
        # redirect: the file, shown or not, whatever the console
        (True, False, True, FD, FILE),
        (True, False, False, FD, FILE),
        (True, False, True, NONE, FILE),
        # tee: the file and the prefixed console; the file alone when filtered out or no console
        (False, True, True, FD, PUMPED_TEE),
        (False, True, True, STREAM, PUMPED_TEE),
        (False, True, False, FD, FILE),
        (False, True, True, NONE, FILE),
        (True, True, True, FD, PUMPED_TEE),
        (True, True, False, STREAM, FILE),
    ],
)
def test_route_stream(redirect, tee, shown, console, expected):
    assert route_stream(redirect=redirect, tee=tee, shown=shown, console=console) == expected


GATED = StreamRoute(Sink.PIPE, gated=True)


@pytest.mark.parametrize(
    ("redirect", "tee", "shown", "console", "expected"),
    [
        # a gated stream (stderr) that reaches the console is piped, to hold back tracebacks
        (False, False, True, FD, GATED),
        (False, False, True, STREAM, GATED),
        (False, True, True, FD, StreamRoute(Sink.PIPE, logged=True, prefixed=True, gated=True)),
        # one that does not reach the console is routed as any other
        (False, False, True, NONE, DISCARD),
        (False, False, False, FD, DISCARD),
        (True, False, True, FD, FILE),
        (False, True, False, FD, FILE),
    ],
)
def test_route_stream_of_a_gated_stream(redirect, tee, shown, console, expected):
    assert route_stream(redirect=redirect, tee=tee, shown=shown, console=console, gated=True) == expected


@pytest.mark.parametrize(("path", "tee", "expected"), [
    ("", False, StreamRoute(Sink.INHERIT)),  # a plugin's console stream has no file to keep tracebacks in
    ("/logs/0.err", True, StreamRoute(Sink.PIPE, logged=True, prefixed=True, gated=True)),
    ("/logs/0.err", False, FILE),
])
def test_a_plugins_stream_is_gated_only_when_tee_d_to_its_file(path, tee, expected):
    assert route_dest(path, tee, FD, gated=True) == expected


@pytest.mark.parametrize(
    ("path", "tee", "console", "expected"),
    [
        # a LogsSpecs plugin's "" is torch's console: the stream nobody redirected
        ("", False, FD, StreamRoute(Sink.INHERIT)),
        ("", False, STREAM, StreamRoute(Sink.PIPE)),
        ("", False, NONE, DISCARD),
        ("", True, FD, StreamRoute(Sink.INHERIT)),  # a tee of the console is the console
        # os.devnull: nowhere, whatever else is asked
        (os.devnull, False, FD, DISCARD),
        (os.devnull, True, STREAM, DISCARD),
        # a file: written by the child, or pumped to the file and the prefixed console when tee'd
        ("/logs/0.out", False, FD, FILE),
        ("/logs/0.out", True, FD, PUMPED_TEE),
        ("/logs/0.out", True, STREAM, PUMPED_TEE),
        ("/logs/0.out", True, NONE, FILE),
    ],
)
def test_route_dest(path, tee, console, expected):
    assert route_dest(path, tee, console) == expected


def test_a_plugins_destination_names_the_files_of_logged_streams_only(tmp_path):
    consoles = {"stdout": io.StringIO(), "stderr": io.StringIO()}
    dest = RankDest(str(tmp_path / "r0.out"), "", tee_stdout=True, error_file=str(tmp_path / "e.json"))
    out = WorkerOutput.from_dest(dest, consoles)
    assert out.routes == {"stdout": PUMPED_TEE, "stderr": StreamRoute(Sink.PIPE)}
    assert out.logs == WorkerLogs(stdout=str(tmp_path / "r0.out"), stderr=None, error_file=str(tmp_path / "e.json"))

    run_child(out, "import sys; print('a'); sys.stderr.write('b')")

    assert consoles["stdout"].getvalue() == "[r0]:a\n" and consoles["stderr"].getvalue() == "b\n"
    assert (tmp_path / "r0.out").read_text() == "a\n"


def test_console_kind_tells_file_descriptors_from_python_streams():
    with open(os.devnull, "w") as devnull:
        assert console_kind(devnull) is Console.FD
    assert console_kind(io.StringIO()) is Console.STREAM
    assert console_kind(None) is Console.NONE


def output(tmp_path, consoles, **masks) -> WorkerOutput:
    both = lambda value: {"stdout": value, "stderr": value}  # noqa: E731
    return WorkerOutput.planned(str(tmp_path), redirect=both(masks.get("redirect", False)),
                                tee=both(masks.get("tee", False)), shown=True, consoles=consoles)


def run_child(out: WorkerOutput, code: str) -> None:
    with out.stdio() as std:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=std["stdout"], stderr=std["stderr"])
    out.start_pumps(proc, "[r0]:", 0)
    assert proc.wait(timeout=30) == 0
    for pump in out.pumps:
        pump.join(timeout=10)
        assert not pump.is_alive()


def test_a_tee_to_a_python_stream_writes_the_file_and_prefixed_console_lines(tmp_path):
    console = {"stdout": io.StringIO(), "stderr": io.StringIO()}
    out = output(tmp_path, console, tee=True)

    run_child(out, "import sys; print('a'); print('b'); sys.stderr.write('oops')")

    assert console["stdout"].getvalue() == "[r0]:a\n[r0]:b\n"
    assert console["stderr"].getvalue() == "[r0]:oops\n"
    with open(out.logs.stdout) as f:
        assert f.read() == "a\nb\n"
    assert len(out.pumps) == 2


def test_without_a_console_a_tee_still_lands_in_its_file(tmp_path):
    out = output(tmp_path, {"stdout": None, "stderr": None}, tee=True)

    run_child(out, "print('kept')")

    assert len(out.pumps) == 2
    with open(out.logs.stdout) as f:
        assert f.read() == "kept\n"


def test_redirected_streams_reach_their_files_through_pumps_and_never_the_console(tmp_path):
    consoles = {"stdout": io.StringIO(), "stderr": io.StringIO()}
    out = output(tmp_path, consoles, redirect=True)

    run_child(out, "import sys; print('x'); sys.stderr.write('y')")

    assert len(out.pumps) == 2  # the agent writes the files, so a full disk never reaches the child
    with open(out.logs.stdout) as f_out, open(out.logs.stderr) as f_err:
        assert (f_out.read(), f_err.read()) == ("x\n", "y")
    assert consoles["stdout"].getvalue() == consoles["stderr"].getvalue() == ""
    assert out.logs.error_file == os.path.join(str(tmp_path), "error.json")


def test_a_worker_whose_redirected_output_meets_a_full_disk_runs_on():
    # /dev/full fails every write with ENOSPC: a child writing there itself would die of it.
    out = WorkerOutput.from_dest(RankDest("/dev/full", "/dev/full"), {"stdout": None, "stderr": None})
    assert out.routes == {"stdout": FILE, "stderr": FILE}

    run_child(out, "import sys\nfor i in range(1000): print(i, flush=True); print(i, file=sys.stderr)")


# -- a log file that cannot be written (a full disk) --------------------------------------------


class Reporter:
    """Records what a pump reports (the lines are LogLossReporter's, tested on their own)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def lost(self, directory: str, nbytes: int, error: OSError) -> None:
        self.calls.append(("lost", directory, nbytes, error.errno))

    def written(self, directory: str) -> None:
        self.calls.append(("written", directory))


def pump_lines(path: str, lines: list[bytes], reporter: Reporter, between=lambda index: None) -> str:
    """Run a pump from a real pipe to ``path`` and a Python console; feed it ``lines`` (each
    ending a line) one by one, ``between(i)`` once line i reached the console; returns the
    console's text."""
    read_end, write_end = os.pipe()
    console = io.StringIO()
    pump = Pump("pump-stdout-0", read_end, path, console, "[r0]:", reporter=reporter)
    pump.start()
    try:
        for index, line in enumerate(lines):
            os.write(write_end, line)
            shown = sum(chunk.count(b"\n") for chunk in lines[:index + 1])
            wait_until(lambda: console.getvalue().count("\n") == shown)
            between(index)
    finally:
        os.close(write_end)
        pump.join(timeout=10)
    assert not pump.is_alive()
    return console.getvalue()


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_full_disk_costs_the_log_file_its_lines_but_never_the_console_or_the_pipe(caplog):
    reporter = Reporter()
    # /dev/full opens fine and fails every write with ENOSPC: the pump must go on draining.
    with caplog.at_level(logging.ERROR):
        console = pump_lines("/dev/full", [b"one\n", b"two\n", b"three\n"], reporter)

    assert console == "[r0]:one\n[r0]:two\n[r0]:three\n"
    assert reporter.calls == [("lost", "/dev", 4, errno.ENOSPC), ("lost", "/dev", 4, errno.ENOSPC),
                              ("lost", "/dev", 6, errno.ENOSPC)]
    assert not caplog.records  # no "Log pump ... failed", no traceback


class FillingFile(io.RawIOBase):
    """A log file on a disk with ``room`` bytes left: a write takes what fits (a short write),
    then fails with ENOSPC; :attr:`room` can be raised again (space freed)."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if not self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        taken = bytes(data[:self.room])
        self.data += taken
        self.room -= len(taken)
        return len(taken)


def test_once_space_is_freed_the_log_resumes_with_a_line_marking_the_gap(monkeypatch, tmp_path):
    disk = FillingFile(room=6)  # "first\n" fits, then the disk is full
    monkeypatch.setattr(output_module, "open_private_file", lambda path, mode, **options: disk)
    reporter = Reporter()

    def free_space(index: int) -> None:
        if index == 2:
            disk.room = 1000

    console = pump_lines(str(tmp_path / "stdout.log"), [b"first\n", b"second\n", b"third\n", b"fourth\n"],
                         reporter, between=free_space)

    assert console == "[r0]:first\n[r0]:second\n[r0]:third\n[r0]:fourth\n"
    assert disk.data.decode() == ("first\n"
                                  "[elasticrun: 13 bytes of output lost here (No space left on device)]\n"
                                  "fourth\n")
    directory = str(tmp_path)
    assert reporter.calls == [("lost", directory, 7, errno.ENOSPC), ("lost", directory, 6, errno.ENOSPC),
                              ("written", directory)]


def test_a_short_write_loses_only_what_did_not_fit_and_the_marker_starts_a_new_line(monkeypatch, tmp_path):
    disk = FillingFile(room=9)  # "first\nsec": a line cut short
    monkeypatch.setattr(output_module, "open_private_file", lambda path, mode, **options: disk)
    reporter = Reporter()

    def free_space(index: int) -> None:
        if index == 0:
            disk.room = 1000

    pump_lines(str(tmp_path / "stdout.log"), [b"first\nsecond\n", b"third\n"], reporter, between=free_space)

    assert disk.data.decode() == ("first\nsec\n"
                                  "[elasticrun: 4 bytes of output lost here (No space left on device)]\n"
                                  "third\n")
    assert [call[:3] for call in reporter.calls] == [("lost", str(tmp_path), 4), ("written", str(tmp_path))]


def test_a_log_file_that_cannot_even_be_created_is_created_once_there_is_space(monkeypatch, tmp_path):
    disk = FillingFile(room=1000)
    attempts = []

    def create(path, mode, **options):
        attempts.append(path)
        if len(attempts) <= 2:  # at the start, and for the first line
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        return disk

    monkeypatch.setattr(output_module, "open_private_file", create)
    reporter = Reporter()

    pump_lines(str(tmp_path / "stdout.log"), [b"first\n", b"second\n"], reporter)

    assert disk.data.decode() == "[elasticrun: 6 bytes of output lost here (Disk quota exceeded)]\nsecond\n"
    assert [call[:3] for call in reporter.calls] == [("lost", str(tmp_path), 6), ("written", str(tmp_path))]


def test_a_log_file_refused_for_another_reason_still_fails_the_start(tmp_path):
    (tmp_path / "target").write_text("")
    (tmp_path / "stdout.log").symlink_to(tmp_path / "target")
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(OSError, match="symbolic link"):
            Pump("pump-stdout-0", read_end, str(tmp_path / "stdout.log"), io.StringIO(), "", reporter=Reporter())
    finally:
        os.close(read_end)
        os.close(write_end)
