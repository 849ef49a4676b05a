"""Creating the files the agent writes (event log, worker logs, error files) safely.

Paths like ``--log-dir`` and ``--event-log`` often sit in shared directories (``/tmp``). A
file there is opened without following a symbolic link in its last component (so another
user's ``/tmp/events.jsonl -> ~victim/.bashrc`` cannot redirect our writes) and, when
created, gets owner-only permissions (0600; a stricter umask still applies), since logs and
error reports can carry tracebacks, paths and environment details.

A file replaced whole (:func:`replace_file`: an error file, the PID file, a timeline page, an
RPC checkpoint) is written to a new temporary file beside it, created exclusively under a
random name (``O_EXCL``: never an existing file, never through a link another user planted at
a predictable ``<path>.tmp<pid>``), then renamed over it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from typing import IO, Callable

__all__ = ["PRIVATE_MODE", "open_private", "open_private_file", "replace_file"]

PRIVATE_MODE = 0o600
"""Permissions of a file the agent creates, before the umask."""


def open_private(path: str | os.PathLike[str], flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> int:
    """``os.open(path, flags)`` that never follows a final symbolic link and creates files 0600.

    Raises:
        OSError: as os.open; a symbolic link gives ``ELOOP`` with a message saying so.
    """
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_MODE)
    except OSError as error:
        if error.errno == errno.ELOOP and os.path.islink(path):
            raise OSError(errno.ELOOP, "it is a symbolic link, which is not followed", os.fspath(path)) from error
        raise


def open_private_file(path: str | os.PathLike[str], mode: str = "wb", **options: object) -> IO:
    """:func:`open_private` as a file object; ``mode`` is ``"wb"``, ``"ab"``, ``"w"`` or ``"a"``.

    Raises:
        OSError: see :func:`open_private`.
        ValueError: another mode.
    """
    flags = {"w": os.O_TRUNC, "a": os.O_APPEND}.get(mode[:1])
    if flags is None or mode[1:] not in ("", "b"):
        raise ValueError(f"open_private_file writes only; mode {mode!r} is not one of wb, ab, w, a.")
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | flags)
    try:
        return open(fd, mode, **options)  # type: ignore[call-overload]  # noqa: SIM115 - the caller closes it
    except BaseException:
        os.close(fd)
        raise


def replace_file(path: str | os.PathLike[str], write: Callable[[IO[bytes]], object], *, mode: int = PRIVATE_MODE,
                 durable: bool = False) -> None:
    """Replace ``path`` whole, or leave it as it was: ``write`` fills a new file created
    exclusively beside it (permissions ``mode`` before the umask), which is then renamed over it.
    With ``durable``, the file is fsync'ed before the rename and its directory after.

    Raises:
        OSError: the file could not be created, written or renamed (the temporary file is
            removed); whatever ``write`` raises, likewise.
    """
    directory, name = os.path.split(os.path.abspath(path))
    for _ in range(16):  # a name another process took (96 random bits): try another
        temporary = os.path.join(directory, f".{name}.{secrets.token_hex(12)}.tmp")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
            break
        except FileExistsError:
            continue
    else:
        raise OSError(errno.EEXIST, "no free temporary name beside it", os.fspath(path))
    try:
        with open(fd, "wb") as out:
            write(out)
            if durable:
                out.flush()
                os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    if durable:
        _fsync_directory(directory)


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
