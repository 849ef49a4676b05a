"""etcd in a container started with ``testcontainers``, on the engine ``DOCKER_HOST`` names."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from elastic.testing.etcd_server.health import enable_auth, wait_healthy
from elastic.testing.etcd_server.server import ENV_MODE, EtcdServer, EtcdServerError, EtcdServerOptions
from elastic.testing.tls import make_tls_files

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "quay.io/coreos/etcd:v3.5.17"


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
        wait_healthy(self, f"{self.endpoints}/health", options.startup_timeout, None)
        if options.auth:
            enable_auth(self, options.password)

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
            wait_healthy(self, f"{self.endpoints}/health", self.options.startup_timeout, None)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines the container wrote, for error messages."""
        try:
            out, err = self._container.get_logs()  # type: ignore[union-attr]
        except Exception:  # not started, or the engine is gone
            return "(no log)"
        return "\n".join((out + err).decode(errors="replace").splitlines()[-lines:])

    def failure_log(self) -> str:
        return self.log_tail()

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
