"""Fixtures of the chaos suite: real etcd clusters, a network namespace, jobs (``report_figures``
is in tests/conftest.py).

Each fixture stops what it started by PID (or deletes what it created) in its finalizer, also
when the test fails. When etcd cannot start, the test fails with one line (tests/conftest.py
turns an ``EtcdServerError`` into that line); it never skips. So does the namespace fixture
when it cannot create one (not root, no ``ip``), and the small filesystem's when it cannot mount
one (not root).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import chaoslib  # noqa: E402

from support.etcd_cluster import EtcdCluster  # noqa: E402
from support.netns import NamespaceError, NamespaceLink  # noqa: E402
from support.small_fs import SmallFilesystem, SmallFilesystemError  # noqa: E402

@pytest.fixture
def etcd_cluster_factory():
    """``make(size, client_hosts=(), extra_args=())`` -> a started :class:`EtcdCluster`, closed at teardown."""
    made: list[EtcdCluster] = []

    def make(size: int, client_hosts: tuple[str, ...] = (), extra_args: tuple[str, ...] = ()) -> EtcdCluster:
        cluster = EtcdCluster(size, client_hosts=client_hosts, extra_args=extra_args)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()


@pytest.fixture
def netns_link():
    """A network namespace joined to the host by a veth pair; deleted at teardown."""
    try:
        link = NamespaceLink()
    except NamespaceError as error:
        pytest.fail(f"could not create a network namespace for the partition test: {error}", pytrace=False)
    try:
        yield link
    finally:
        link.close()


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs at ``tmp_path/disk``; unmounted at teardown. Ask for it before
    ``job_factory``: the job's processes are then stopped before it is unmounted."""
    try:
        disk = SmallFilesystem(tmp_path / "disk")
    except SmallFilesystemError as error:
        pytest.fail(f"could not mount a small filesystem for the full-disk test: {error}", pytrace=False)
    try:
        yield disk
    finally:
        disk.close()


@pytest.fixture
def job_factory(tmp_path):
    """``make(launcher, **settings)`` -> a :class:`chaoslib.ChaosJob`; every process it started is
    killed by PID at teardown (before the clusters and namespaces are removed)."""
    jobs: list[chaoslib.ChaosJob] = []

    def make(launcher: str, **settings) -> chaoslib.ChaosJob:
        job = chaoslib.ChaosJob(launcher, tmp_path / f"job{len(jobs)}", **settings)
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        job.close()
