"""etcd v3 backend over gRPC (the etcd v3 API through the ``etcd3`` package's generated stubs).

Modules, one job each: :mod:`~backends.etcd.config` (settings), :mod:`~backends.etcd.translate`
(gRPC errors to :mod:`backends.errors`), :mod:`~backends.etcd.convert` (protobuf to contract
types), :mod:`~backends.etcd.connection` (channels, auth, failover, retries),
:mod:`~backends.etcd.watch` (every watch on one resuming stream),
:mod:`~backends.etcd.keepalive` (lease renewals on one stream per endpoint), :mod:`~backends.etcd.backend` (the contract).
"""

from backends.etcd.backend import EtcdBackend
from backends.etcd.config import EtcdConfig

__all__ = ["EtcdBackend", "EtcdConfig"]
