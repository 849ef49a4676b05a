"""etcd-elastic: elastic rendezvous, agent and launcher for PyTorch."""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("etcd-elastic")
except _metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
