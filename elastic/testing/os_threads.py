"""What each OS thread of a process is doing, from ``/proc``: for a process that hangs in C.

faulthandler (see :mod:`elastic.testing.with_stacks`) shows Python frames only, and a process
that hangs in interpreter finalization (C++ destructors, library shutdown) has none left. The
kernel still knows every thread's name, state and where it sleeps. Linux only; a process or
thread that is gone, or a file that cannot be read, is reported as such, never raised.
"""

from __future__ import annotations

import os

__all__ = ["describe_threads"]

_MAX_KERNEL_FRAMES = 6


def _read(path: str) -> str | None:
    try:
        with open(path, errors="replace") as file:
            return file.read().strip()
    except OSError:
        return None


def describe_threads(pid: int) -> str:
    """One line per thread of ``pid``: id, name, state, wait channel, top kernel frames."""
    try:
        tids = sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task"))
    except OSError as error:
        return f"process {pid}: cannot list its threads ({error.strerror})"
    lines = [f"process {pid}: {len(tids)} thread(s)"]
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        name = _read(f"{base}/comm") or "?"
        stat = _read(f"{base}/stat") or ""
        state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
        wchan = _read(f"{base}/wchan")
        wchan = wchan if wchan and wchan != "0" else "-"
        stack = _read(f"{base}/stack")  # root only; lines like "[<0>] futex_wait+0x67/0x120"
        frames = [line.split("] ", 1)[-1].split("+", 1)[0] for line in (stack or "").splitlines()]
        frames = frames[:_MAX_KERNEL_FRAMES]
        lines.append(f"  tid {tid} {name!r} state {state} wchan {wchan}"
                     + (f" kernel {' < '.join(frames)}" if frames else ""))
    return "\n".join(lines)
