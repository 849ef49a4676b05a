"""Whether ``--log-dir`` can hold the workers' logs: judged before the run, created at its start.

``os.makedirs`` on ``/dev/null`` or a regular file raises ``FileExistsError``, under ``/proc``
``FileNotFoundError``, on a read-only filesystem ``OSError``: each ended ``elasticrun`` in a
traceback. :func:`log_dir_problem` says in a few words what is wrong with a value without
creating anything (the CLI refuses it with status 2); :func:`create_log_dir` creates it at the
start of the run and raises one ``ValueError`` line for what only creating can tell (status 1).
Neither ever removes or writes into an existing file.
"""

from __future__ import annotations

import os

__all__ = ["PSEUDO_FILESYSTEMS", "create_log_dir", "log_dir_problem"]

PSEUDO_FILESYSTEMS = frozenset({
    "proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "pstore", "bpf", "configfs",
    "fusectl", "efivarfs", "binfmt_misc", "devpts", "mqueue", "nsfs", "autofs",
})
"""Kernel filesystems that hold no user files (their directories refuse new entries)."""

_MOUNTINFO = "/proc/self/mountinfo"


def log_dir_problem(log_dir: str, *, mountinfo: str = _MOUNTINFO) -> str | None:
    """What stops ``log_dir`` from holding logs, as the end of a sentence, or None when nothing
    does as far as can be told without creating it.

    Looks at ``log_dir`` or, when it does not exist yet, at its nearest existing ancestor: it
    must be a directory, not on a kernel pseudo-filesystem (read from ``mountinfo``), and
    writable by this user (``access(2)``, which also reports a read-only filesystem).
    """
    path = os.path.abspath(log_dir)
    existing = path
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    named = "it" if existing == path else repr(existing)
    if not os.path.isdir(existing):
        return f"{named} is not a directory"
    fstype = filesystem_type(existing, mountinfo)
    if fstype in PSEUDO_FILESYSTEMS:
        return f"{named} is on {fstype}, a kernel pseudo-filesystem that holds no files"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{named} is not writable by this user"
    return None


def create_log_dir(log_dir: str) -> None:
    """Create ``log_dir`` (and its parents) unless it exists as a directory.

    Raises:
        ValueError: it cannot be created or is not a writable directory; one line naming it.
    """
    problem = log_dir_problem(log_dir)
    if problem is None:
        try:
            os.makedirs(log_dir, exist_ok=True)
        except OSError as error:
            problem = f"it cannot be created ({error.strerror or error})"
    if problem is None and not os.access(log_dir, os.W_OK | os.X_OK):
        problem = "it is not writable by this user"
    if problem is not None:
        raise ValueError(f"--log-dir {log_dir[:200]!r}: {problem}; give a writable directory.")


def filesystem_type(path: str, mountinfo: str = _MOUNTINFO) -> str | None:
    """The type of the filesystem holding ``path`` (``proc``, ``ext4``...), or None when the
    mount table cannot be read (not Linux)."""
    real = os.path.realpath(path)
    best, fstype = -1, None
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as table:
            for line in table:
                fields = line.split()
                if "-" not in fields:
                    continue
                dash = fields.index("-")
                if len(fields) <= dash + 1 or len(fields) < 5:
                    continue
                point = _unescape(fields[4])
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= best:  # the longest, and the last of stacked mounts
                    best, fstype = len(point), fields[dash + 1]
    except OSError:
        return None
    return fstype


def _unescape(field: str) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes come as ``\\ooo`` octal escapes."""
    if "\\" not in field:
        return field
    out, index = [], 0
    while index < len(field):
        if field[index] == "\\" and field[index + 1:index + 4].isdigit():
            out.append(chr(int(field[index + 1:index + 4], 8)))
            index += 4
        else:
            out.append(field[index])
            index += 1
    return "".join(out)
