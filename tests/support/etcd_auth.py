"""A least-privilege etcd user for a job, set up with ``etcdctl`` as docs/security.md shows.

:func:`least_privilege_lines` are the shell lines an operator runs: a role with readwrite on the
job's key prefix and nothing else, a user holding only that role, and auth switched on (after
``root``, which etcd requires first). docs/security.md shows them for user ``train-job`` and
prefix ``/elastic/``; ``tests/security/test_etcd_least_privilege.py`` checks that it shows
exactly these. :func:`run_lines` runs such lines against a test etcd with the ``etcdctl`` the
tests use, so every test that needs such a user sets it up the way the docs tell operators to.

Passwords stay out of the lines (``"$ROOT_PASSWORD"``, ``"$JOB_PASSWORD"``, shell variables in
the docs); :func:`run_lines` fills them in.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from typing import Mapping, Sequence

from elastic.testing.etcd_server.binaries import find_etcdctl_binary
from elastic.testing.etcd_server.server import EtcdServerError

ROOT_PASSWORD = "$ROOT_PASSWORD"
"""Where the root password goes in the lines."""
JOB_PASSWORD = "$JOB_PASSWORD"
"""Where the job user's password goes in the lines."""
ETCDCTL_TIMEOUT = 30.0
"""Seconds one etcdctl command may take."""


def root_lines() -> tuple[str, ...]:
    """Create ``root`` with the ``root`` role: etcd refuses to enable auth before that."""
    return (
        f'etcdctl user add root --new-user-password="{ROOT_PASSWORD}"',
        "etcdctl role add root",
        "etcdctl user grant-role root root",
    )


def job_user_lines(user: str, prefix: str) -> tuple[str, ...]:
    """A role named ``user`` with readwrite on the keys under ``prefix`` only, and ``user`` holding it."""
    if not prefix.startswith("/") or not prefix.endswith("/"):
        raise ValueError(f"The key prefix ({prefix!r}) must start and end with '/', e.g. /elastic/.")
    return (
        f"etcdctl role add {user}",
        f"etcdctl role grant-permission --prefix=true {user} readwrite {prefix}",
        f'etcdctl user add {user} --new-user-password="{JOB_PASSWORD}"',
        f"etcdctl user grant-role {user} {user}",
    )


def least_privilege_lines(user: str = "train-job", prefix: str = "/elastic/") -> tuple[str, ...]:
    """Every line, in order, for an etcd without auth yet: root, the job's role and user, ``auth enable``."""
    return (*root_lines(), *job_user_lines(user, prefix), "etcdctl auth enable")


def run_lines(lines: Sequence[str], endpoints: str, passwords: Mapping[str, str], *,
              login: str | None = None, environ: Mapping[str, str] | None = None) -> None:
    """Run each ``etcdctl`` line against ``endpoints`` (``ETCDCTL_ENDPOINTS``), in order.

    Args:
        passwords: what replaces :data:`ROOT_PASSWORD` and :data:`JOB_PASSWORD` in the lines.
        login: ``USER:PASSWORD`` for an etcd that has auth on already (``--user``).
        environ: more ``ETCDCTL_*`` variables (e.g. ``ETCDCTL_CACERT``).

    Raises:
        ValueError: a line is not an ``etcdctl`` command.
        EtcdServerError: etcdctl failed (its output is in the message).
    """
    env = {**os.environ, **(environ or {}), "ETCDCTL_ENDPOINTS": endpoints}
    etcdctl = find_etcdctl_binary()
    for line in lines:
        words = shlex.split(line)
        if not words or words[0] != "etcdctl":
            raise ValueError(f"Not an etcdctl command: {line!r}.")
        for placeholder, password in passwords.items():
            words = [word.replace(placeholder, password) for word in words]
        argv = [etcdctl, *([f"--user={login}"] if login else []), *words[1:]]
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=ETCDCTL_TIMEOUT)
        if result.returncode != 0:
            raise EtcdServerError(f"`{line}` failed (exit {result.returncode}): {result.stderr.strip() or result.stdout}")
