"""A stand-in for the agents of a live-recovery job, on one machine, for tests and benchmarks.

It does what the agent side of the contract does (:mod:`elastic.worker.rounds`), nothing
more: it hosts each round's c10d ``TCPStore`` (in this process, so it imports torch, lazily),
starts workers with a round pipe and the first round's environment, writes one line per new
round to every live worker, and injects faults (SIGKILL, SIGSTOP, closing a pipe).

Workers are named by *slot* (``"w0"``, ``"w3"``): a slot is one worker process for its life.
A round lists its slots in rank order; ranks follow that order, as a round record's would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from support.freeze import freeze, thaw
from elastic.worker.rounds import (
    READY_FD_VAR,
    ROUND_FD_VAR,
    ROUND_VAR,
    STORE_PREFIX_VAR,
    Ready,
    Round,
    default_store_prefix,
    encode_round_line,
    parse_ready_line,
)

__all__ = ["AgentRound", "SimulatedAgent", "WorkerProcess", "read_events"]


@dataclass(frozen=True)
class AgentRound:
    """One round the simulated agent created: its number, slots in rank order, and its store."""

    number: int
    slots: tuple[str, ...]
    master_port: int
    store_prefix: str
    restart_count: int = 0

    def for_slot(self, slot: str, master_addr: str = "127.0.0.1") -> Round:
        rank = self.slots.index(slot)
        return Round(round=self.number, rank=rank, world_size=len(self.slots), local_rank=0, local_world_size=1,
                     group_rank=rank, master_addr=master_addr, master_port=self.master_port,
                     restart_count=self.restart_count, store_prefix=self.store_prefix)


@dataclass
class WorkerProcess:
    slot: str
    proc: subprocess.Popen
    pipe_w: int | None
    log: Path
    stderr: Path
    ready_r: int | None = None
    published: list[tuple[int, float]] = field(default_factory=list)
    """(round, time.monotonic() when written) for every line written to this worker."""


class SimulatedAgent:
    """Hosts round stores and runs worker processes of ``script``.

    Args:
        workdir: where each worker's event log (``<slot>.jsonl``) and stderr go.
        env: extra environment for every worker (PYTHONPATH, the script's settings).
        ready_pipe: also give each worker an ``ELASTIC_READY_FD`` pipe.
    """

    def __init__(self, script: str | Path, workdir: Path, env: Mapping[str, str], run_id: str = "live-test",
                 ready_pipe: bool = False) -> None:
        self.script = str(script)
        self.workdir = workdir
        self.env = dict(env)
        self.run_id = run_id
        self.ready_pipe = ready_pipe
        self.workers: dict[str, WorkerProcess] = {}
        self.rounds: list[AgentRound] = []
        self._stores: list[Any] = []

    def new_round(self, slots: Sequence[str]) -> AgentRound:
        """Host a fresh store on a new port for the next round of ``slots`` (in rank order)."""
        from datetime import timedelta

        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
        self._stores.append(store)
        number = len(self.rounds)
        round_ = AgentRound(number, tuple(slots), store.port, default_store_prefix(self.run_id, number))
        self.rounds.append(round_)
        return round_

    def start(self, slot: str, round_: AgentRound, extra_env: Mapping[str, str] | None = None) -> WorkerProcess:
        """Start the worker of ``slot`` in ``round_`` with a round pipe."""
        spec = round_.for_slot(slot)
        read_fd, write_fd = os.pipe()
        os.set_inheritable(read_fd, True)
        pass_fds = [read_fd]
        env = {**os.environ, **self.env, **(extra_env or {})}
        env.update({
            "RANK": str(spec.rank), "WORLD_SIZE": str(spec.world_size), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "GROUP_RANK": str(spec.group_rank), "MASTER_ADDR": spec.master_addr, "MASTER_PORT": str(spec.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(spec.restart_count), "TORCHELASTIC_RUN_ID": self.run_id,
            "TORCHELASTIC_USE_AGENT_STORE": "True", ROUND_FD_VAR: str(read_fd), ROUND_VAR: str(spec.round),
            STORE_PREFIX_VAR: spec.store_prefix, "LIVE_LOG": str(self.workdir / f"{slot}.jsonl"), "LIVE_SLOT": slot,
        })
        ready_r = None
        if self.ready_pipe:
            ready_r, ready_w = os.pipe()
            os.set_inheritable(ready_w, True)
            os.set_blocking(ready_r, False)
            pass_fds.append(ready_w)
            env[READY_FD_VAR] = str(ready_w)
        stderr_path = self.workdir / f"{slot}.stderr"
        with open(stderr_path, "wb") as stderr:
            proc = subprocess.Popen([sys.executable, self.script], env=env, pass_fds=pass_fds,
                                    stdout=subprocess.DEVNULL, stderr=stderr)
        os.close(read_fd)
        if self.ready_pipe:
            os.close(ready_w)
        worker = WorkerProcess(slot, proc, write_fd, self.workdir / f"{slot}.jsonl", stderr_path, ready_r)
        self.workers[slot] = worker
        return worker

    def publish(self, round_: AgentRound, slots: Sequence[str] | None = None) -> float:
        """Write ``round_`` to the live workers of its slots (or of ``slots``); the time written."""
        now = time.monotonic()
        for slot in slots if slots is not None else round_.slots:
            self.write(slot, encode_round_line(round_.for_slot(slot)))
            self.workers[slot].published.append((round_.number, now))
        return now

    def write(self, slot: str, data: bytes) -> None:
        """Write raw bytes to ``slot``'s round pipe (garbage included)."""
        worker = self.workers[slot]
        if worker.pipe_w is None or worker.proc.poll() is not None:
            return
        view = memoryview(data)
        while view:
            view = view[os.write(worker.pipe_w, view):]

    def close_pipe(self, slot: str) -> None:
        """Close ``slot``'s round pipe: the worker reads EOF, as when its agent dies."""
        worker = self.workers[slot]
        if worker.pipe_w is not None:
            os.close(worker.pipe_w)
            worker.pipe_w = None

    def kill(self, slot: str) -> float:
        """SIGKILL ``slot``'s worker and reap it; the time the signal was sent."""
        proc = self.workers[slot].proc
        sent = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        return sent

    def freeze(self, slot: str) -> float:
        """SIGSTOP ``slot``'s worker and wait until all its threads stopped; the time the signal was sent."""
        sent = time.monotonic()
        freeze(self.workers[slot].proc.pid)
        return sent

    def thaw(self, slot: str) -> None:
        thaw(self.workers[slot].proc.pid)

    def ready_lines(self, slot: str) -> list[Ready]:
        """The lines the worker wrote to its ready pipe since the last call.

        Raises:
            ReadyLineError: the worker wrote a line that is not a ready line.
        """
        worker = self.workers[slot]
        data = b""
        while worker.ready_r is not None:
            try:
                chunk = os.read(worker.ready_r, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
        return [parse_ready_line(line) for line in data.splitlines() if line]

    def events(self, slot: str) -> list[dict]:
        return read_events(self.workers[slot].log)

    def wait_for(self, condition, timeout: float, what: str, poll: float = 0.02) -> None:
        """Poll ``condition()`` until true; raise ``TimeoutError`` naming ``what`` and the workers' stderr tails."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{what}: not within {timeout}s\n{self.describe()}")
            time.sleep(poll)

    def describe(self) -> str:
        lines = []
        for slot, worker in self.workers.items():
            tail = worker.stderr.read_text(errors="replace")[-1500:] if worker.stderr.exists() else ""
            steps = [event.get("step") for event in self.events(slot) if event.get("ev") == "step"]
            lines.append(f"--- {slot} pid {worker.proc.pid} rc {worker.proc.poll()} last step {steps[-1:]}\n{tail}")
        return "\n".join(lines)

    def close(self) -> None:
        """Kill every worker left (by pid), close the pipes and the stores."""
        for worker in self.workers.values():
            if worker.proc.poll() is None:
                try:
                    os.kill(worker.proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                worker.proc.kill()
                worker.proc.wait(10)
            for fd in (worker.pipe_w, worker.ready_r):
                if fd is not None:
                    os.close(fd)
            worker.pipe_w = worker.ready_r = None
        self._stores.clear()


def read_events(path: Path) -> list[dict]:
    """The JSON lines of a worker's event log (a torn last line is skipped)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    events = []
    for line in text.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events
