"""The lifeline watchdog: ``python -S -c <program>``, one per agent (it calls :func:`main`).

The agent (:class:`elastic.agent.lifeline.watchdog_process.Watchdog`) starts it in its own session
with stdin the read end of a pipe whose only write end the agent holds, and later writes the
path of its PID file there, one line. When the agent dies, however, the kernel closes that end
and the watchdog reads EOF: it SIGKILLs every worker the agent's PID file still names, with
their descendants and sessions (:func:`elastic.agent.lifeline.pidfile.kill_workers`), removes
the file, prints one line to the agent's stderr and exits. An agent that exits normally removes
its file first, and one that never wrote a path had no workers: the watchdog then exits at once.

It starts without ``site`` (``-S``: the two directories it needs beyond the standard library
are given, see :mod:`elastic.agent.lifeline.watchdog_process`), imports what it needs (psutil)
before it blocks, so the kill does not wait for an import, and leaves with ``os._exit``, so an
agent closing its lifeline does not wait for a teardown.
"""

from __future__ import annotations

import os
import signal
import sys

from elastic.agent.lifeline import pidfile

_PATH_MAX = 65536
"""The most of stdin kept: the PID file's path is one line (bounded: the pipe is read to EOF)."""


def read_path(fd: int = 0) -> str:
    """Read ``fd`` until EOF (the agent gone); the first line written, the PID file's path."""
    data = bytearray()
    while chunk := os.read(fd, 4096):
        if len(data) < _PATH_MAX:
            data += chunk
    return os.fsdecode(bytes(data).partition(b"\n")[0])


def watch() -> int:
    """Wait for EOF on stdin (the agent gone), then stop what the PID file it named names; the
    exit status."""
    for sig in (signal.SIGINT, signal.SIGHUP):  # the agent's terminal is not ours to obey
        signal.signal(sig, signal.SIG_IGN)
    path = read_path()
    if not path:
        return 0  # never armed: the agent ended before it had workers
    try:
        live = pidfile.read(path)
    except FileNotFoundError:
        return 0  # the agent exited normally and removed it
    except (pidfile.PidFileError, OSError) as exc:
        print(f"elasticrun watchdog: cannot read {path}: {exc}", file=sys.stderr)
        return 1
    if live.host != pidfile.host_key():  # its pids mean other processes here: never act on them
        print(f"elasticrun watchdog: {path} names host {live.host}, not this one ({pidfile.host_key()}); "
              "leaving it alone", file=sys.stderr)
        return 1
    killed = pidfile.kill_workers(live.workers)
    pidfile.remove(path)
    if killed:
        try:
            print(f"elasticrun watchdog: agent {live.agent.pid} of run {live.run_id} died; "
                  f"killed {len(killed)} worker process(es) {killed}", file=sys.stderr, flush=True)
        except OSError:
            pass
    return 0


def main() -> None:
    """The entry point: the PID file's path comes on stdin; never returns."""
    if len(sys.argv) != 1:
        print("usage: python -m elastic.agent.lifeline.watchdog  (started by elasticrun; the PID file's path "
              "comes on stdin)", file=sys.stderr)
        sys.exit(2)
    status = watch()
    sys.stderr.flush()
    os._exit(status)  # skip the interpreter's teardown: the agent may be waiting for this exit


if __name__ == "__main__":
    main()
