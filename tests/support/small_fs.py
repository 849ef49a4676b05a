"""A small tmpfs mounted for a test, to fill up and free under a running job (root only).

:class:`SmallFilesystem` mounts a tmpfs of ``size`` bytes (and ``inodes`` files and directories,
if given) at a directory (created if missing). :meth:`~SmallFilesystem.fill` writes one file
(``.filler``) until every write fails with ``ENOSPC`` and, with ``inodes``, creates empty files
(``.filler-<n>``) until no file or directory can be created either (as on a disk whose every
block is taken); :meth:`~SmallFilesystem.free` deletes them. :meth:`~SmallFilesystem.close` unmounts,
lazily (``umount -l``) when a process still holds a file there, and is idempotent; it also runs
when the object is collected or the interpreter exits. Stop the processes writing there first.
Requires root and ``mount`` (util-linux).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import weakref
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["SmallFilesystem", "SmallFilesystemError"]

FILLER = ".filler"


class SmallFilesystemError(RuntimeError):
    """The filesystem could not be mounted; the message names the command and its error."""


class SmallFilesystem:
    """A tmpfs of ``size`` bytes at ``path``; see the module docstring.

    Raises (from the constructor):
        SmallFilesystemError: not root, no ``mount``, or the mount failed.
    """

    def __init__(self, path: str | os.PathLike[str], size: int = 4 << 20, inodes: int | None = None) -> None:
        if size <= 0:
            raise ValueError(f"The filesystem's size ({size}) must be positive.")
        if inodes is not None and inodes <= 0:
            raise ValueError(f"The filesystem's number of inodes ({inodes}) must be positive.")
        if os.geteuid() != 0:
            raise SmallFilesystemError("Mounting a tmpfs needs root (CI runs as root); run these tests as root.")
        if shutil.which("mount") is None or shutil.which("umount") is None:
            raise SmallFilesystemError("`mount`/`umount` (util-linux) are not on PATH; apt-get install mount.")
        self.path = Path(path)
        self.size = size
        self.inodes = inodes
        self.path.mkdir(parents=True, exist_ok=True)
        options = f"size={size},mode=0755" + (f",nr_inodes={inodes}" if inodes else "")
        _run("mount", "-t", "tmpfs", "-o", options, "tmpfs", str(self.path))
        self._finalizer = weakref.finalize(self, _unmount, str(self.path))
        log.info("Mounted a tmpfs of %d bytes at %s", size, self.path)

    def fill(self) -> int:
        """Write zeros to ``.filler`` until the filesystem takes no more, then (with ``inodes``)
        take every inode left; the bytes written."""
        fd = os.open(self.path / FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        total, block = 0, 1 << 20
        try:
            while block:
                try:
                    total += os.write(fd, bytes(block))
                except OSError as error:
                    if error.errno != errno.ENOSPC:
                        raise
                    block //= 2
        finally:
            os.close(fd)
        for index in range(self.inodes or 0):
            try:
                os.close(os.open(self.path / f"{FILLER}-{index}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                break
        return total

    def free(self) -> None:
        """Delete what :meth:`fill` wrote."""
        (self.path / FILLER).unlink(missing_ok=True)
        for index in range(self.inodes or 0):
            (self.path / f"{FILLER}-{index}").unlink(missing_ok=True)

    def free_bytes(self) -> int:
        info = os.statvfs(self.path)
        return info.f_bavail * info.f_frsize

    def close(self) -> None:
        """Unmount (lazily when busy); idempotent."""
        self._finalizer()

    def __enter__(self) -> SmallFilesystem:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _unmount(path: str) -> None:
    try:
        _run("umount", path)
    except SmallFilesystemError as error:
        log.warning("%s; unmounting %s lazily", error, path)
        _run("umount", "-l", path)


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise SmallFilesystemError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()[:300]}")
