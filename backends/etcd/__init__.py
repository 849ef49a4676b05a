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

It also imports grpcio with ``GRPC_VERBOSITY=ERROR`` unless the environment sets the variable
(or grpcio was imported already): gRPC's core otherwise writes an INFO line to stderr for every
failed TLS handshake (``I1129 ... ssl_transport_security.cc:2563] Handshake failed ...``), every
retry of an outage, beside the one line of ours that says what happened, gRPC's reason included.
The variable is read when grpcio is imported and taken out of the environment right after, so
workers inherit the environment as the user gave it; set ``GRPC_VERBOSITY=INFO`` to see gRPC's
own lines.
"""

import os
import sys

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

_QUIET_GRPC = "GRPC_VERBOSITY" not in os.environ and "grpc" not in sys.modules
if _QUIET_GRPC:
    os.environ["GRPC_VERBOSITY"] = "ERROR"
try:
    import grpc  # noqa: E402,F401 (reads GRPC_ENABLE_FORK_SUPPORT and GRPC_VERBOSITY now)
finally:
    if _QUIET_GRPC:
        os.environ.pop("GRPC_VERBOSITY", None)

from backends.etcd.backend import EtcdBackend  # noqa: E402 (after the grpcio settings above)
from backends.etcd.config import EtcdConfig  # noqa: E402

__all__ = ["EtcdBackend", "EtcdConfig"]
