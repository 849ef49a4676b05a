"""A TLS etcd restarted the way operators restart it, under a running job (issue 35, items 2-3).

The same job and verdict as ``test_chaos.py`` (2 agents x 1 gloo worker, ``elasticrun`` and stock
``torchrun`` with our plugin, the fault at step 10; :func:`test_chaos.run` judges it), against a
single etcd serving TLS with client certificates (made by :mod:`elastic.testing.tls`), which is:

* restarted gracefully (item 2): SIGTERM, as systemd, Kubernetes and rolling upgrades stop it,
  then started again on the same data dir. Under TLS etcd ends every open call with gRPC's
  ``INTERNAL: Stream removed`` (not ``UNAVAILABLE``): an outage all the same;
* rotated to a new CA (item 3), the usual way: the CA file of every node (the agents' and
  etcd's) rewritten in place to hold the old and the new CA, etcd's certificate replaced by one
  the new CA signed, then the same graceful restart. The agents read their CA file again
  before they reconnect;
* rotated in the wrong order: etcd restarted with the new CA's certificate first, the agents'
  CA file rewritten only :data:`LATE_CA_FILE_S` seconds later. Meanwhile every handshake fails:
  after a connection has worked that is an outage, retried with the file read again each time.

Through both the job trains on: one attempt of world 2 (every worker keeps its PID), nothing
charged, both agents exit 0; no agent restarts its workers "to be safe", prints a traceback or
passes on gRPC's own ``Handshake failed`` lines.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import chaoslib
from chaoslib import ELASTICRUN, TORCHRUN
from elastic.testing.etcd_server import EtcdServer, EtcdServerOptions, start_etcd_server
from elastic.testing.tls import rotate_server_ca
from test_chaos import STEPS_INSTANT, Context, Scenario, Timeline, run

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.etcd, pytest.mark.needs_torch, pytest.mark.timeout(420)]

LAUNCHERS = [ELASTICRUN, TORCHRUN]

LATE_CA_FILE_S = 3.0
"""Seconds the agents' CA file trails etcd's new certificate in the wrong-order rotation."""
LATE_LEASE_TTL = 10
"""The lease TTL of that scenario: the agents' keepalives fail until their CA file is rewritten,
so a lease shorter than that (the suite's 3 s) would expire on the server, which is etcd's own
word that the member is gone (a re-formation, as after any outage longer than the TTL)."""


@dataclass(frozen=True)
class TlsEtcd:
    """One etcd serving TLS, as :func:`test_chaos.run` sees a cluster, and the agents' CA file
    (a copy of etcd's CA, as each machine has its own)."""

    server: EtcdServer
    ca_file: Path
    workdir: Path

    def endpoints(self, host: str = "127.0.0.1") -> str:
        return self.server.endpoints

    @property
    def rdzv_conf(self) -> str:
        files = self.server.tls_files
        assert files is not None
        return f"cacert={self.ca_file},cert={files.client_cert},key={files.client_key}"


@pytest.fixture
def tls_etcd(tmp_path):
    """A single etcd (a local binary: it is restarted) requiring client certificates; stopped by PID."""
    server = start_etcd_server(EtcdServerOptions(client_cert_auth=True), mode="binary")
    try:
        assert server.tls_files is not None
        ca_file = tmp_path / "agents-ca.pem"
        shutil.copyfile(server.tls_files.ca_cert, ca_file)
        yield TlsEtcd(server, ca_file, tmp_path)
    finally:
        server.close()


def restart_gracefully(ctx: Context) -> Timeline:
    """SIGTERM etcd, wait for it to exit, start it again on the same data dir."""
    server = ctx.cluster.server  # type: ignore[attr-defined]
    at = time.time()
    server.stop(graceful=True)
    server.start()
    return Timeline(at, time.time())


def rotate_ca_and_restart(ctx: Context) -> Timeline:
    """Rewrite every CA file to hold the old and a new CA, give etcd a certificate from the new
    CA, and restart it gracefully."""
    etcd: TlsEtcd = ctx.cluster  # type: ignore[assignment]
    rotate_server_ca(etcd.server.tls_files, etcd.workdir / "new-ca", ca_bundles=[etcd.ca_file])  # type: ignore[arg-type]
    return restart_gracefully(ctx)


def restart_before_rotating_the_ca_file(ctx: Context) -> Timeline:
    """Give etcd a certificate from a new CA (its own CA file holds both) and restart it; rewrite
    the agents' CA file to hold both CAs only :data:`LATE_CA_FILE_S` seconds after it is back."""
    etcd: TlsEtcd = ctx.cluster  # type: ignore[assignment]
    files = etcd.server.tls_files
    assert files is not None
    rotate_server_ca(files, etcd.workdir / "new-ca")
    at = restart_gracefully(ctx).fault_at
    time.sleep(LATE_CA_FILE_S)
    etcd.ca_file.write_bytes(files.ca_cert.read_bytes())
    return Timeline(at, time.time())


def train_through(scenario: Scenario, launcher: str, etcd: TlsEtcd, job_factory, report_figures,
                  rdzv_conf: str = "") -> None:
    job = job_factory(launcher, steps=scenario.steps, step_seconds=scenario.step_seconds,
                      rdzv_conf=",".join(filter(None, (etcd.rdzv_conf, rdzv_conf))))
    run(scenario, launcher, etcd, job, report_figures)
    restarts = chaoslib.figures(job.records(), 0.0).restarts
    assert restarts == {"a": 0, "b": 0}, f"workers were restarted {restarts} times per node\n{job.stderr_tails()}"
    for node, agent in job.agents.items():
        text = agent.stderr
        for unwanted in ("restarting to be safe", "Handshake failed", "Traceback"):
            assert unwanted not in text, f"agent {node} printed {unwanted!r}:\n{job.stderr_tails(6000)}"


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_graceful_restart_of_a_tls_etcd_costs_no_restart(launcher, tls_etcd, job_factory, report_figures):
    scenario = Scenario("tls-sigterm-restart", restart_gracefully, etcd_members=1, steps=STEPS_INSTANT)
    train_through(scenario, launcher, tls_etcd, job_factory, report_figures)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_rotating_etcd_to_a_new_ca_after_rewriting_the_ca_files_costs_no_restart(launcher, tls_etcd, job_factory,
                                                                                report_figures):
    scenario = Scenario("tls-ca-rotation", rotate_ca_and_restart, etcd_members=1, steps=STEPS_INSTANT)
    train_through(scenario, launcher, tls_etcd, job_factory, report_figures)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_ca_file_rewritten_after_etcd_came_back_with_a_new_ca_costs_no_restart(launcher, tls_etcd, job_factory,
                                                                               report_figures):
    scenario = Scenario("tls-ca-file-late", restart_before_rotating_the_ca_file, etcd_members=1)
    train_through(scenario, launcher, tls_etcd, job_factory, report_figures, rdzv_conf=f"lease_ttl={LATE_LEASE_TTL}")
