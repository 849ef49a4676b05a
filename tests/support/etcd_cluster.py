"""A real etcd cluster of local processes for fault-injection tests (the chaos suite).

:class:`EtcdCluster` starts ``size`` members (1 or 3, usually) of the etcd binary the tests use
(:func:`~elastic.testing.etcd_server.find_etcd_binary`, ``$ETCD_BINARY`` first) on free
loopback ports, each with its own data dir under one temporary work dir. A test can then hurt
it the way production etcd gets hurt:

* :meth:`EtcdCluster.leader` asks the members who leads (Maintenance.Status);
* :meth:`EtcdCluster.kill` SIGKILLs a member, :meth:`EtcdCluster.pause` / :meth:`EtcdCluster.resume`
  SIGSTOP / SIGCONT it (a hung member: its sockets accept, nothing answers);
* :meth:`EtcdCluster.start` brings a killed member back on the same ports with its data dir
  (a single-member cluster killed and restarted keeps its keys, revisions and leases).

``extra_args`` go to every member (e.g. ``--quota-backend-bytes=16777216`` for a database that
fills up, see :mod:`support.etcd_load`).

Members listen for clients on ``127.0.0.1`` and on any extra ``client_hosts`` (e.g. the host
side of a veth pair, so an agent inside a network namespace reaches etcd); peers talk over
loopback only. Every process is stopped by its PID: :meth:`EtcdCluster.close` (idempotent)
SIGCONTs and SIGKILLs what still runs and removes the work dir, and a finalizer does the same
if the object is dropped. Unlike :class:`~elastic.testing.etcd_server.BinaryEtcdServer` (one
server, for the contract suite), this has no TLS or auth: the chaos suite needs topology.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from dataclasses import dataclass
from pathlib import Path

import grpc
from etcd3 import etcdrpc

from elastic.testing.etcd_server.binaries import NO_BINARY_HINT, find_etcd_binary
from elastic.testing.etcd_server.local import fast_tmpdir
from elastic.testing.etcd_server.server import EtcdServerError
from elastic.testing.ports import free_port

from support.freeze import freeze

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class MemberSpec:
    """Where one member lives: its name, ports and data dir (fixed for the cluster's life)."""

    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path

    @property
    def peer_url(self) -> str:
        return f"http://{LOOPBACK}:{self.peer_port}"

    def client_url(self, host: str = LOOPBACK) -> str:
        return f"http://{host}:{self.client_port}"


class EtcdCluster:
    """``size`` local etcd members forming one cluster; see the module docstring.

    Raises (from the constructor):
        EtcdServerError: no etcd binary, or the cluster was not healthy within ``startup_timeout``
            (the members' log tails are in the message); whatever started is stopped.
    """

    def __init__(self, size: int = 3, *, client_hosts: tuple[str, ...] = (), binary: str | None = None,
                 startup_timeout: float = 30.0, election_ms: int = 1000, heartbeat_ms: int = 100,
                 extra_args: tuple[str, ...] = ()) -> None:
        if size < 1:
            raise ValueError(f"The cluster size ({size}) must be at least 1.")
        self.binary = binary or find_etcd_binary()
        if not self.binary:
            raise EtcdServerError(NO_BINARY_HINT)
        self.client_hosts = (LOOPBACK, *[host for host in client_hosts if host != LOOPBACK])
        self.startup_timeout = startup_timeout
        self._timing = [f"--election-timeout={election_ms}", f"--heartbeat-interval={heartbeat_ms}", *extra_args]
        self.workdir = Path(tempfile.mkdtemp(prefix="etcd-elastic-cluster-", dir=fast_tmpdir()))
        self.token = f"etcd-elastic-chaos-{self.workdir.name}"
        self.members = tuple(
            MemberSpec(f"m{index}", free_port(), free_port(), self.workdir / f"m{index}",
                       self.workdir / f"m{index}.log")
            for index in range(size)
        )
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._paused: set[str] = set()
        self._live: list[subprocess.Popen[bytes]] = []  # shared with the finalizer, which must not hold self
        self._finalizer = weakref.finalize(self, _stop_all, self._live, self.workdir)
        try:
            for member in self.members:
                self._spawn(member, state="new")
            self.wait_healthy()
        except BaseException:
            self.close()
            raise

    # -- addresses ---------------------------------------------------------------------------
    def endpoints(self, host: str = LOOPBACK) -> str:
        """Every member's client URL as seen from ``host`` (``http://h:p,...``)."""
        return ",".join(member.client_url(host) for member in self.members)

    def member(self, name: str) -> MemberSpec:
        """The member called ``name``. Raises KeyError for an unknown name."""
        for member in self.members:
            if member.name == name:
                return member
        raise KeyError(f"no member {name!r} in {[m.name for m in self.members]}")

    def pid(self, member: MemberSpec) -> int | None:
        """The member's PID while its process exists (also while paused), else None."""
        process = self._processes.get(member.name)
        return process.pid if process is not None and process.poll() is None else None

    def pids(self) -> list[int]:
        return [pid for pid in (self.pid(member) for member in self.members) if pid is not None]

    def running(self, member: MemberSpec) -> bool:
        """Whether the member's process exists and is not paused."""
        return self.pid(member) is not None and member.name not in self._paused

    # -- faults ------------------------------------------------------------------------------
    def leader(self, timeout: float = 10.0) -> MemberSpec:
        """The member the running members agree leads the cluster.

        Raises:
            EtcdServerError: no leader agreed within ``timeout`` seconds (e.g. no quorum).
        """
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            ids: dict[int, MemberSpec] = {}
            leaders: set[int] = set()
            for member in self.members:
                if not self.running(member):
                    continue
                try:
                    status = _status(member, timeout=1.0)
                except grpc.RpcError as error:
                    last = f"{member.name}: {error.code().name}"
                    continue
                ids[status.header.member_id] = member
                leaders.add(status.leader)
            if len(leaders) == 1 and next(iter(leaders)) in ids:
                return ids[next(iter(leaders))]
            last = f"leaders reported {sorted(leaders)}, members {sorted(ids)}"
            time.sleep(0.1)
        raise EtcdServerError(f"no etcd leader agreed on within {timeout}s ({last}).")

    def kill(self, member: MemberSpec) -> None:
        """SIGKILL the member by PID (resumed first if paused) and reap it; its data dir stays."""
        process = self._processes.pop(member.name, None)
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGKILL)
        if member.name in self._paused:
            os.kill(process.pid, signal.SIGCONT)
            self._paused.discard(member.name)
        process.wait(timeout=10)
        self._live.remove(process)
        log.info("Killed etcd member %s (pid %d)", member.name, process.pid)

    def pause(self, member: MemberSpec) -> None:
        """SIGSTOP the member: it keeps its sockets but answers nothing (peers lose it)."""
        pid = self.pid(member)
        if pid is None:
            raise EtcdServerError(f"etcd member {member.name} is not running; it cannot be paused.")
        self._paused.add(member.name)
        freeze(pid)
        log.info("Paused etcd member %s (pid %d)", member.name, pid)

    def resume(self, member: MemberSpec) -> None:
        """SIGCONT a paused member."""
        pid = self.pid(member)
        if pid is not None and member.name in self._paused:
            os.kill(pid, signal.SIGCONT)
            log.info("Resumed etcd member %s (pid %d)", member.name, pid)
        self._paused.discard(member.name)

    def start(self, member: MemberSpec, wait: bool = True) -> None:
        """Start a killed member again on its ports with its data dir; wait until it is healthy.

        Raises:
            EtcdServerError: it exited or was not healthy within the startup timeout.
        """
        if self.pid(member) is not None:
            return
        self._spawn(member, state="existing")
        if wait:
            _wait_member_healthy(self, member, self.startup_timeout)

    def wait_healthy(self, timeout: float | None = None) -> None:
        """Wait until every running member says it is healthy (it sees a leader with a quorum).

        Raises:
            EtcdServerError: one was not within ``timeout`` (default: the startup timeout).
        """
        deadline = time.monotonic() + (self.startup_timeout if timeout is None else timeout)
        for member in self.members:
            if self.running(member):
                _wait_member_healthy(self, member, max(0.1, deadline - time.monotonic()))

    def log_tail(self, member: MemberSpec, lines: int = 20) -> str:
        try:
            return "\n".join(member.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def close(self) -> None:
        """Stop every member by PID and remove the work dir; idempotent."""
        for member in self.members:
            self.kill(member)
        self._finalizer()

    def __enter__(self) -> "EtcdCluster":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------
    def _spawn(self, member: MemberSpec, state: str) -> None:
        with open(member.log_path, "ab") as log_file:
            try:
                process = subprocess.Popen(
                    [self.binary, *self._arguments(member, state)],  # type: ignore[list-item]
                    stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                )
            except OSError as error:
                raise EtcdServerError(f"could not run etcd binary {self.binary}: {error}") from error
        self._processes[member.name] = process
        self._live.append(process)
        log.info("Started etcd member %s pid %d on %s", member.name, process.pid, member.client_url())

    def _arguments(self, member: MemberSpec, state: str) -> list[str]:
        cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        listen = ",".join(member.client_url(host) for host in self.client_hosts)
        return [
            f"--name={member.name}",
            f"--data-dir={member.data_dir}",
            f"--listen-client-urls={listen}",
            f"--advertise-client-urls={member.client_url()}",
            f"--listen-peer-urls={member.peer_url}",
            f"--initial-advertise-peer-urls={member.peer_url}",
            f"--initial-cluster={cluster}",
            f"--initial-cluster-state={state}",
            f"--initial-cluster-token={self.token}",
            "--logger=zap",
            "--log-level=warn",
            *self._timing,
        ]


def _status(member: MemberSpec, timeout: float) -> "etcdrpc.StatusResponse":
    with grpc.insecure_channel(f"{LOOPBACK}:{member.client_port}") as channel:
        return etcdrpc.MaintenanceStub(channel).Status(etcdrpc.StatusRequest(), timeout=timeout)


def _wait_member_healthy(cluster: EtcdCluster, member: MemberSpec, timeout: float) -> None:
    """Poll the member's ``/health`` until it is healthy; fail early if its process exits.

    Raises:
        EtcdServerError: not healthy in time, or the process exited (its log tail is shown).
    """
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        process = cluster._processes.get(member.name)
        if process is None or process.poll() is not None:
            code = None if process is None else process.returncode
            raise EtcdServerError(f"etcd member {member.name} exited ({code}):\n{cluster.log_tail(member)}")
        try:
            with urllib.request.urlopen(f"{member.client_url()}/health", timeout=1.0) as response:
                if json.loads(response.read() or b"{}").get("health") in ("true", True):
                    return
                last = f"HTTP {response.status}"
        except (OSError, ValueError, urllib.error.URLError) as error:
            last = str(error)
        time.sleep(0.1)
    raise EtcdServerError(f"etcd member {member.name} was not healthy within {timeout:.1f}s (last: {last}).\n"
                          f"{cluster.log_tail(member)}")


def _stop_all(processes: list["subprocess.Popen[bytes]"], workdir: Path) -> None:
    """Last-resort cleanup: SIGCONT and SIGKILL by PID what still runs, then remove the work dir."""
    for process in processes:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            os.kill(process.pid, signal.SIGCONT)
            process.wait()
    processes.clear()
    shutil.rmtree(workdir, ignore_errors=True)
