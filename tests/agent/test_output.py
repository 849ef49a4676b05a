"""Where a worker's streams go: the routing decision as a table, then its files and pumps."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from elastic.agent.processes.output import Console, Sink, StreamRoute, WorkerOutput, console_kind, route_stream

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


def test_console_kind_tells_file_descriptors_from_python_streams():
    with open(os.devnull, "w") as devnull:
        assert console_kind(devnull) is Console.FD
    assert console_kind(io.StringIO()) is Console.STREAM
    assert console_kind(None) is Console.NONE


def output(tmp_path, consoles, **masks) -> WorkerOutput:
    both = lambda value: {"stdout": value, "stderr": value}  # noqa: E731
    return WorkerOutput(str(tmp_path), redirect=both(masks.get("redirect", False)), tee=both(masks.get("tee", False)),
                        shown=True, consoles=consoles)


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
