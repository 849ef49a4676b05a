"""The lifeline watchdog: ``python -c <WATCHDOG_PROGRAM> <pid file>``, one per agent (it calls :func:`main`).

The agent (:class:`elastic.agent.lifeline.keeper.Lifeline`) starts it in its own session with stdin
the read end of a pipe whose only write end the agent holds. When the agent dies, however, the
kernel closes that end and the watchdog reads EOF: it SIGKILLs every worker the agent's PID file
still names, with their descendants and sessions (:func:`elastic.agent.lifeline.pidfile.kill_workers`),
removes the file, prints one line to the agent's stderr and exits. An agent that exits normally
removes its file first: the watchdog then exits at once.

It imports what it needs (psutil) before it blocks, so the kill does not wait for an import,
and leaves with ``os._exit``, so an agent closing its lifeline does not wait for a teardown.
"""

from __future__ import annotations

import os
import signal
import sys

from elastic.agent.lifeline import pidfile


def watch(path: str) -> int:
    """Wait for EOF on stdin (the agent gone), then stop what ``path`` names; the exit status."""
    for sig in (signal.SIGINT, signal.SIGHUP):  # the agent's terminal is not ours to obey
        signal.signal(sig, signal.SIG_IGN)
    while os.read(0, 4096):
        pass
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
    """The entry point: ``sys.argv[1]`` is the PID file; never returns."""
    if len(sys.argv) != 2:
        print("usage: python -m elastic.agent.lifeline.watchdog <pid file>  (started by elasticrun)", file=sys.stderr)
        sys.exit(2)
    status = watch(sys.argv[1])
    sys.stderr.flush()
    os._exit(status)  # skip the interpreter's teardown: the agent may be waiting for this exit


if __name__ == "__main__":
    main()
