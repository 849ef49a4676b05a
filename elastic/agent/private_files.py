"""Creating the files the agent writes (event log, worker logs, error files) safely.

Paths like ``--log-dir`` and ``--event-log`` often sit in shared directories (``/tmp``). A
file there is opened without following a symbolic link in its last component (so another
user's ``/tmp/events.jsonl -> ~victim/.bashrc`` cannot redirect our writes) and, when
created, gets owner-only permissions (0600; a stricter umask still applies), since logs and
error reports can carry tracebacks, paths and environment details.
"""

from __future__ import annotations

import errno
import os
from typing import IO

__all__ = ["PRIVATE_MODE", "open_private", "open_private_file"]

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
