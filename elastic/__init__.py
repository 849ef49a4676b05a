"""etcd-elastic: elastic rendezvous, agent and launcher for PyTorch.

``__version__`` is read from the installed distribution on first use, not at import: the
``importlib.metadata`` lookup costs every ``elasticrun`` start about 20 ms otherwise.
"""

from __future__ import annotations


def __getattr__(name: str) -> str:
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import metadata

    try:
        version = metadata.version("etcd-elastic")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        version = "0+unknown"
    globals()["__version__"] = version
    return version
