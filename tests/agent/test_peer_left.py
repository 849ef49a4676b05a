"""Which worker tracebacks only say that a peer left (a case table), and the gate that keeps them
off the console (on a fake clock, then through a real pump and a real child)."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap

import pytest

from elastic.agent.processes.output import WorkerOutput
from elastic.agent.processes.peer_left import (
    MAX_HELD_BYTES, MAX_HOLD_S, QUIET_S, Release, TracebackGate, only_peer_left,
)

FRAMES = """Traceback (most recent call last):
  File "/work/train.py", line 40, in <module>
    dist.all_reduce(t)
  File "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252, in all_reduce
    work.wait()
"""
GLOO_CLOSED = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
               "by peer [127.0.0.1]:46213. This is typically caused by a remote worker crashing. Check the logs of the "
               "remote worker before reporting an error. GLHF! \U0001f3d6\ufe0f")
GLOO_RESET = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
              "[127.0.0.1]:17100: Connection reset by peer. This is typically caused by a remote worker hanging or bugs "
              "in the application.")
NCCL = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, remote "
        "process exited or there was a network error, NCCL version 2.21.5\n"
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.")
STORE = "torch.distributed.DistNetworkError: failed to recv, got 0 bytes"
LIVE = "elastic.worker.errors.CollectiveFailed: round 0: a collective failed: Connection closed by peer"
GLOO_TIMEOUT = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                "1800000ms for recv operation to complete")
CHAINED = "\nDuring handling of the above exception, another exception occurred:\n\n"


def traceback(exception: str, prefix: str = "") -> str:
    text = FRAMES + exception + "\n"
    return "".join(prefix + line for line in text.splitlines(keepends=True))


@pytest.mark.parametrize(("block", "withheld"), [
    # a peer that left, in the words of gloo, NCCL, the store and elastic.worker; Ctrl-C
    (traceback(GLOO_CLOSED), True),
    (traceback(GLOO_CLOSED, "[rank3]: "), True),  # torch's excepthook after init_process_group
    (traceback(GLOO_RESET), True),
    (traceback(NCCL), True),
    (traceback(STORE), True),
    (traceback(LIVE), True),
    (traceback("KeyboardInterrupt"), True),
    (traceback(GLOO_CLOSED) + CHAINED + traceback("KeyboardInterrupt"), True),  # Ctrl-C while it failed
    ("Exception in thread Thread-1 (watch):\n" + traceback(GLOO_RESET), True),
    (traceback(GLOO_CLOSED, "[rank0]: ") + "[W1129 02:19:27 ProcessGroupGloo.cpp:1] Warning: a torch warning\n", True),
    # the user's own: stays on the console
    (traceback("ZeroDivisionError: division by zero"), False),
    (traceback("ZeroDivisionError: division by zero", "[rank1]: "), False),
    (traceback("ConnectionResetError: [Errno 104] Connection reset by peer"), False),  # their own download
    (traceback("RuntimeError: Connection reset by peer"), False),  # not gloo's words
    (traceback("torch.distributed.DistBackendError: NCCL error: unhandled cuda error"), False),
    (traceback(GLOO_TIMEOUT), False),  # a hang is not a peer that left
    (traceback("ValueError: bad batch") + CHAINED + traceback(GLOO_CLOSED), False),  # any exception of theirs
    (traceback(GLOO_CLOSED) + CHAINED + traceback("ValueError: bad batch"), False),
    (traceback(GLOO_CLOSED) + traceback("ZeroDivisionError: division by zero"), False),  # two at once
    (FRAMES, False),  # cut short: no exception line
    ("Connection closed by peer\n", False),  # no traceback at all
])
def test_only_tracebacks_whose_every_exception_says_a_peer_left_are_withheld(block, withheld):
    assert only_peer_left(block) is withheld


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_ordinary_output_passes_at_once_even_without_a_line_end(clock):
    gate = TracebackGate(clock=clock)
    assert gate.feed(b"step 1\nstep 2\n") == Release(shown=b"step 1\nstep 2\n")
    assert gate.feed(b"\r 50%|#####     |") == Release(shown=b"\r 50%|#####     |")  # a progress bar
    assert gate.feed(b"\r100%|##########|\n") == Release(shown=b"\r100%|##########|\n")
    assert not gate.holding


def test_a_peer_left_traceback_is_withheld_and_what_follows_is_shown(clock):
    gate = TracebackGate(clock=clock)
    block = traceback(GLOO_CLOSED, "[rank0]: ").encode()
    assert gate.feed(b"loss 0.5\n" + block) == Release(shown=b"loss 0.5\n")
    assert gate.holding and gate.tick() == Release()  # not quiet yet
    clock.now += QUIET_S
    assert gate.tick() == Release(withheld=block) and gate.last_withheld
    assert gate.feed(b"loss 0.4\n") == Release(shown=b"loss 0.4\n")
    assert gate.end() == Release()


def test_the_users_traceback_is_shown_whole_at_the_end_of_the_stream(clock):
    gate = TracebackGate(clock=clock)
    block = traceback("ZeroDivisionError: division by zero").encode()
    released = gate.feed(block[:30]) + gate.feed(block[30:])  # as two reads of the pipe
    assert released == Release()
    assert gate.end() == Release(shown=block) and not gate.last_withheld


def test_a_block_is_found_when_its_first_line_is_split_between_reads(clock):
    gate = TracebackGate(clock=clock)
    block = traceback("KeyboardInterrupt", "[rank1]: ").encode()
    assert gate.feed(b"x\n[ran") == Release(shown=b"x\n")
    assert gate.feed(b"k1]: Trace") == Release()
    assert gate.feed(block[len("[rank1]: Trace"):]) == Release()
    assert gate.end() == Release(withheld=block)


def test_a_line_start_that_turns_out_ordinary_is_shown_once_complete_or_quiet(clock):
    gate = TracebackGate(clock=clock)
    assert gate.feed(b"Trace") == Release()
    assert gate.feed(b"s of rain\n") == Release(shown=b"Traces of rain\n")
    assert gate.feed(b"[r") == Release()
    clock.now += QUIET_S
    assert gate.tick() == Release(shown=b"[r")
    assert gate.feed(b"ank0]: Traceback (most recent call last):\n") == Release(shown=b"ank0]: Traceback (most "
                                                                                 b"recent call last):\n")


def test_a_block_is_decided_after_the_longest_hold_however_busy_the_stream(clock):
    gate = TracebackGate(clock=clock)
    block = traceback("KeyboardInterrupt").encode()
    gate.feed(block)
    for _ in range(int(MAX_HOLD_S / 0.25)):
        clock.now += 0.25
        assert gate.feed(b"chatter\n") == Release()
    clock.now += 0.25
    assert gate.tick() == Release(withheld=block + b"chatter\n" * int(MAX_HOLD_S / 0.25))


def test_a_block_longer_than_the_bound_is_shown_as_it_is(clock):
    gate = TracebackGate(clock=clock)
    header = b"Traceback (most recent call last):\n"
    frames = b'  File "x.py", line 1, in f\n' * (MAX_HELD_BYTES // 28 + 1)
    released = gate.feed(header) + gate.feed(frames)
    assert released == Release(shown=header + frames) and not gate.holding


# -- through a real pump -----------------------------------------------------------------------
CHILD = textwrap.dedent("""
    import sys
    print("training", flush=True)
    sys.stderr.write("step 1 done\\n")
    raise RuntimeError({message!r})
""")


def run_child(output: WorkerOutput, message: str) -> None:
    with output.stdio() as std:
        proc = subprocess.Popen([sys.executable, "-c", CHILD.format(message=message)], stdout=std["stdout"],
                                stderr=std["stderr"])
    output.start_pumps(proc, "[default0]:", 0)
    assert proc.wait(timeout=30) == 1
    for pump in output.pumps:
        pump.join(timeout=10)
        assert not pump.is_alive()


def planned(tmp_path, consoles, tee: bool = False) -> WorkerOutput:
    return WorkerOutput.planned(str(tmp_path), redirect={"stdout": False, "stderr": False},
                                tee={"stdout": tee, "stderr": tee}, shown=True, consoles=consoles)


def test_by_default_a_peer_left_traceback_goes_to_the_ranks_stderr_log_only(tmp_path):
    consoles = {"stdout": io.StringIO(), "stderr": io.StringIO()}
    output = planned(tmp_path, consoles)
    run_child(output, GLOO_CLOSED.split(": ", 1)[1])
    assert consoles["stdout"].getvalue() == "training\n"
    assert consoles["stderr"].getvalue() == "step 1 done\n"
    kept = (tmp_path / "stderr.log").read_text()
    assert kept.startswith("Traceback (most recent call last):") and "Connection closed by peer" in kept
    assert output.logs.stderr is None  # by default stderr.log holds only what the console withheld
    assert output.peer_left_at_end(1.0) == str(tmp_path / "stderr.log")


def test_by_default_the_users_traceback_is_shown_and_no_file_is_written(tmp_path):
    consoles = {"stdout": io.StringIO(), "stderr": io.StringIO()}
    output = planned(tmp_path, consoles)
    run_child(output, "a bug of the user's")
    shown = consoles["stderr"].getvalue()
    assert shown.startswith("step 1 done\nTraceback (most recent call last):")
    assert shown.endswith("RuntimeError: a bug of the user's\n")
    assert not (tmp_path / "stderr.log").exists() and output.peer_left_at_end(1.0) is None


def test_with_tee_the_file_keeps_every_line_and_the_console_the_prefixed_rest(tmp_path):
    consoles = {"stdout": io.StringIO(), "stderr": io.StringIO()}
    output = planned(tmp_path, consoles, tee=True)
    run_child(output, GLOO_CLOSED.split(": ", 1)[1])
    assert consoles["stdout"].getvalue() == "[default0]:training\n"
    assert consoles["stderr"].getvalue() == "[default0]:step 1 done\n"
    kept = (tmp_path / "stderr.log").read_text()
    assert kept.startswith("step 1 done\nTraceback (most recent call last):") and "Connection closed by peer" in kept
