"""Where a worker's streams go: the routing decision as a table, then its files and pumps."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from elastic.agent.processes.output import (
    Console, RankDest, Sink, StreamRoute, WorkerLogs, WorkerOutput, console_kind, route_dest, route_stream,
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

    assert out.pumps == []
    with open(out.logs.stdout) as f:
        assert f.read() == "kept\n"


def test_redirected_streams_are_written_by_the_child_with_no_pump(tmp_path):
    out = output(tmp_path, {"stdout": io.StringIO(), "stderr": io.StringIO()}, redirect=True)

    run_child(out, "import sys; print('x'); sys.stderr.write('y')")

    assert out.pumps == []
    with open(out.logs.stdout) as f_out, open(out.logs.stderr) as f_err:
        assert (f_out.read(), f_err.read()) == ("x\n", "y")
    assert out.logs.error_file == os.path.join(str(tmp_path), "error.json")
