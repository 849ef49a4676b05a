"""etcd v3 backend over gRPC (the etcd v3 API through the ``etcd3`` package's generated stubs).

Modules, one job each: :mod:`~backends.etcd.config` (settings), :mod:`~backends.etcd.translate`
(gRPC errors to :mod:`backends.errors`), :mod:`~backends.etcd.convert` (protobuf to contract
types), :mod:`~backends.etcd.channel_options` (grpcio's bounds and keepalives),
:mod:`~backends.etcd.connection` (channels, auth, failover, retries),
:mod:`~backends.etcd.tls_files` (the TLS files, read again before each new connection),
:mod:`~backends.etcd.watch` (every watch on one resuming stream),
:mod:`~backends.etcd.keepalive` (lease renewals on one stream per endpoint), :mod:`~backends.etcd.backend` (the contract).

Importing this package turns grpcio's fork handlers off (``GRPC_ENABLE_FORK_SUPPORT=false``)
unless the environment already sets the variable: when a process forks while other threads are
inside gRPC, those handlers now and then abort the forked child with SIGABRT (measured: 6 of 600
``subprocess.Popen(preexec_fn=...)`` children while four threads made etcd calls; none of 600
without the handlers). The agent forks its workers while its etcd client is busy, and its
children exec at once, so the handlers buy nothing there. grpcio reads the variable when it is
first imported, so this runs before any module here imports it; worker processes inherit it.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from backends.etcd.backend import EtcdBackend  # noqa: E402 (after the grpcio setting above)
from backends.etcd.config import EtcdConfig  # noqa: E402

__all__ = ["EtcdBackend", "EtcdConfig"]
