"""Starting the test etcd that ``mode`` or ``$ETCD_TEST_BACKEND`` chooses."""

from __future__ import annotations

import logging
import os

from elastic.testing.etcd_server.binaries import find_etcd_binary
from elastic.testing.etcd_server.container import DockerEtcdServer, docker_available
from elastic.testing.etcd_server.external import ExternalEtcdServer
from elastic.testing.etcd_server.local import BinaryEtcdServer
from elastic.testing.etcd_server.server import ENV_MODE, EtcdServer, EtcdServerError, EtcdServerOptions

log = logging.getLogger(__name__)

MODES = ("auto", "docker", "binary", "external")


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
