"""A local ``etcd`` binary on free loopback ports, with its data in a temporary directory."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
import weakref
from pathlib import Path

from elastic.testing.etcd_server.binaries import NO_BINARY_HINT, find_etcd_binary
from elastic.testing.etcd_server.health import enable_auth, wait_healthy
from elastic.testing.etcd_server.server import EtcdServer, EtcdServerError, EtcdServerOptions
from elastic.testing.ports import free_port
from elastic.testing.tls import make_tls_files

log = logging.getLogger(__name__)


class BinaryEtcdServer(EtcdServer):
    """A local ``etcd`` process on free loopback ports, with its data in a temporary directory.

    Raises (from the constructor):
        EtcdServerError: no binary, or it did not become healthy in time (its log tail is shown).
    """

    mode = "binary"

    def __init__(self, options: EtcdServerOptions = EtcdServerOptions(), binary: str | None = None) -> None:
        super().__init__(options)
        self.binary = binary or find_etcd_binary()
        if not self.binary:
            raise EtcdServerError(NO_BINARY_HINT)
        self.workdir = Path(tempfile.mkdtemp(prefix="etcd-elastic-test-", dir=fast_tmpdir()))
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / "etcd.log"
        self.client_port = free_port()
        self.peer_port = free_port()
        if options.uses_tls:
            self.tls_files = make_tls_files(self.workdir / "tls")
        self._process: subprocess.Popen[bytes] | None = None
        self._live: list[subprocess.Popen[bytes]] = []  # shared with the finalizer, which must not hold self
        self._finalizer = weakref.finalize(self, _kill_and_remove, self._live, self.workdir)
        self._auth_enabled = False
        try:
            self.start()
        except BaseException:
            self.close()
            raise

    @property
    def endpoints(self) -> str:
        scheme = "https" if self.options.uses_tls else "http"
        return f"{scheme}://127.0.0.1:{self.client_port}"

    @property
    def unix_endpoint(self) -> str:
        """The unix socket endpoint (with ``unix_socket=True``). etcd names a unix listener
        ``host:port`` and creates it in its working directory, which is :attr:`workdir`."""
        return f"unix://{self.workdir}/localhost:{self.client_port}"

    @property
    def pid(self) -> int | None:
        """PID of the running etcd, or None when stopped."""
        return self._process.pid if self.running else None  # type: ignore[union-attr]

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start etcd (again) on the same ports and data dir and wait until it is healthy."""
        if self.running:
            return
        with open(self.log_path, "ab") as log_file:
            try:
                self._process = subprocess.Popen(
                    [self.binary, *self._arguments()],  # type: ignore[list-item]
                    cwd=self.workdir,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                )
            except OSError as error:
                raise EtcdServerError(f"could not run etcd binary {self.binary}: {error}") from error
        self._live[:] = [self._process]
        log.info("Started etcd pid %d on %s (data %s)", self._process.pid, self.endpoints, self.data_dir)
        try:
            wait_healthy(self, self._health_url(), self.options.startup_timeout, self._process)
            if self.options.auth and not self._auth_enabled:
                enable_auth(self, self.options.password)
                self._auth_enabled = True
        except BaseException:
            self.stop(graceful=False)
            raise

    def stop(self, graceful: bool = True) -> None:
        """Stop etcd by PID: SIGTERM then, after 10 s, SIGKILL (``graceful=False``: SIGKILL at once)."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM if graceful else signal.SIGKILL)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("etcd pid %d ignored SIGTERM for 10s; killing it", process.pid)
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
        self._live.clear()
        log.info("Stopped etcd pid %d (exit %s)", process.pid, process.returncode)

    def close(self) -> None:
        self.stop()
        self._finalizer()  # removes the work dir (and kills nothing: the process is gone)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines etcd wrote, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def failure_log(self) -> str:
        """The last lines etcd wrote; for an empty log, what may explain it (a full disk writes none)."""
        tail = self.log_tail()
        if tail.strip():
            return tail
        try:
            stat = os.statvfs(self.workdir)
            free = f"{stat.f_bavail * stat.f_frsize // (1 << 20)} MiB free"
        except OSError as error:
            free = f"free space unknown: {error}"
        return (f"(etcd wrote nothing to {self.log_path}; {free} in {self.workdir}; "
                f"command: {self.binary} {' '.join(self._arguments())})")

    def _health_url(self) -> str:
        return f"{self.endpoints}/health"

    def _arguments(self) -> list[str]:
        scheme = "https" if self.options.uses_tls else "http"
        client_url = f"{scheme}://127.0.0.1:{self.client_port}"
        peer_url = f"http://127.0.0.1:{self.peer_port}"
        args = [
            "--name=test",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client_url}" + (
                f",unix://localhost:{self.client_port}" if self.options.unix_socket else ""
            ),
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=test={peer_url}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token=etcd-elastic-{self.client_port}",
            "--logger=zap",
            "--log-level=warn",
        ]
        if self.tls_files is not None:
            args += [f"--cert-file={self.tls_files.server_cert}", f"--key-file={self.tls_files.server_key}"]
            args += [f"--trusted-ca-file={self.tls_files.ca_cert}"]
            if self.options.client_cert_auth:
                args.append("--client-cert-auth")
        return args + self.options.limit_flags()


FAST_TMPDIR_MIN_FREE = 1 << 30
"""Bytes ``/dev/shm`` must have free to hold a test etcd's data (its WAL alone preallocates 64 MiB)."""


def fast_tmpdir(shm: str = "/dev/shm") -> str | None:
    """``/dev/shm`` when writable with :data:`FAST_TMPDIR_MIN_FREE` free (etcd fsyncs every write;
    tmpfs keeps tests fast), else the default temporary directory."""
    if not (os.path.isdir(shm) and os.access(shm, os.W_OK)):
        return None
    try:
        stat = os.statvfs(shm)
    except OSError:
        return None
    return shm if stat.f_bavail * stat.f_frsize >= FAST_TMPDIR_MIN_FREE else None


def _kill_and_remove(processes: list["subprocess.Popen[bytes]"], workdir: Path) -> None:
    """Last-resort cleanup at garbage collection or interpreter exit: SIGKILL by PID what still runs,
    then remove the work dir."""
    for process in processes:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
    shutil.rmtree(workdir, ignore_errors=True)
