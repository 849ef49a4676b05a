"""The faults a shared production etcd really has, under a running job (issue 27, items 1-4).

The same job and verdict as ``test_chaos.py`` (2 agents x 1 gloo worker, ``elasticrun`` and stock
``torchrun`` with our plugin, the fault at step 10; :func:`test_chaos.run` judges it), against a
single etcd member that is:

* restarted while another tenant writes and compacts every 2 s (item 1): the resumed watches
  meet compacted history, and a reconnect must not become a restart;
* full (item 2): another tenant filled a 16 MiB ``--quota-backend-bytes`` until the NOSPACE
  alarm, and a worker crashes during the alarm; the job re-forms once the operator cleaned etcd
  (delete, compact, defrag, alarm disarm), one clear line and no traceback meanwhile;
* slow (item 3): every byte to and from etcd goes through a
  :class:`~support.latency_proxy.LatencyProxy` (200 ms and 1 s each way) from the
  agents' start, and a worker crashes at step 10: both nodes train and re-form (at 0 ms: the
  same crash on a fast link, the figures' baseline);
* cleared by an operator (item 4): ``etcdctl del --prefix`` of the job's keys; the job re-forms
  and every agent says the keys were deleted (under torchrun too, which shows no INFO of ours);
* an operator's ``etcdctl lease revoke`` of one agent's lease (the server's word that the member
  is gone): the job re-forms once, nothing charged.

The full etcd, the deleted keys and the revoked lease run once more as ``elasticrun-live``
(``elasticrun --live-recovery``, judged as in ``test_chaos.py``).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import grpc
import pytest
from etcd3 import etcdrpc

import chaoslib
from chaoslib import ELASTICRUN, ELASTICRUN_LIVE, TORCHRUN
from elastic.rendezvous.records import RendezvousKeys
from test_chaos import STEPS_INSTANT, Context, Scenario, Timeline, run

from support.etcd_cluster import EtcdCluster
from support.etcd_load import BusyTenant, clear_nospace, fill_until_nospace, nospace_alarmed
from support.latency_proxy import LatencyProxy

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.etcd, pytest.mark.needs_torch, pytest.mark.timeout(420)]

LAUNCHERS = [ELASTICRUN, TORCHRUN]
WITH_LIVE = [ELASTICRUN, ELASTICRUN_LIVE, TORCHRUN]
"""The faults whose live-recovery path differs from test_chaos's rows run once more as elasticrun-live
(a crash during a store outage, the job's keys gone, a lease revoked). The compaction and latency
rows passed once in live mode (docs/live-recovery.md) but stay out of CI for its time."""


def address(ctx: Context) -> str:
    return f"127.0.0.1:{ctx.cluster.members[0].client_port}"


def crash_worker(ctx: Context, node: str = "b") -> float:
    """SIGKILL node ``node``'s current worker (the last one that wrote a step); returns when."""
    steps = [record for record in ctx.job.records() if record.node == node and record.event == "step"]
    assert steps, f"node {node} has no worker that trained"
    os.kill(steps[-1].pid, signal.SIGKILL)
    return time.time()


def said(job: chaoslib.ChaosJob, text: str) -> dict[str, bool]:
    return {node: text in agent.stderr for node, agent in job.agents.items()}


def no_tracebacks(job: chaoslib.ChaosJob) -> None:
    """No agent printed a traceback of its own (a surviving worker's, "[rank0]: Traceback ..."
    after its peer crashed, is the worker's output, which the agent passes on)."""
    printed = [node for node, agent in job.agents.items()
               if any(line.startswith("Traceback") for line in agent.stderr.splitlines())]
    assert not printed, f"agents {printed} printed a traceback:\n{job.stderr_tails(6000)}"


# -- item 1: compaction --------------------------------------------------------------------------
COMPACT_EVERY = 2.0


def restart_under_compaction(ctx: Context) -> Timeline:
    """Another tenant writes 10 keys/s and compacts every 2 s; the only member is SIGKILLed and
    started again after 5 s; the tenant goes on for 10 s after the restart."""
    member = ctx.cluster.members[0]
    with BusyTenant(address(ctx), write_every=0.1, compact_every=COMPACT_EVERY) as tenant:
        time.sleep(2 * COMPACT_EVERY)
        at = time.time()
        ctx.cluster.kill(member)
        time.sleep(5)
        ctx.cluster.start(member)
        healed = time.time()
        time.sleep(5 * COMPACT_EVERY)
    assert tenant.compactions >= 5, f"the tenant compacted only {tenant.compactions} times"
    return Timeline(at, healed)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_an_etcd_restarted_under_compaction_every_2s_costs_no_restart(launcher, etcd_cluster_factory, job_factory,
                                                                      report_figures):
    scenario = Scenario("restart-compacting", restart_under_compaction, etcd_members=1)
    job = job_factory(launcher, steps=scenario.steps, step_seconds=scenario.step_seconds)
    run(scenario, launcher, etcd_cluster_factory(1), job, report_figures)
    assert "restarting to be safe" not in "".join(agent.stderr for agent in job.agents.values())


# -- item 2: a full etcd -------------------------------------------------------------------------
QUOTA = ("--quota-backend-bytes=16777216",)
ALARM_SECONDS = 10.0


def crash_while_full(ctx: Context) -> Timeline:
    """Fill etcd to its quota (NOSPACE), crash node b's worker, keep the alarm for 10 s (both
    agents must be alive then), then clean etcd as an operator does."""
    fill_until_nospace(address(ctx))
    assert nospace_alarmed(address(ctx))
    at = crash_worker(ctx)
    time.sleep(ALARM_SECONDS)
    exited = {node: agent.proc.poll() for node, agent in ctx.job.agents.items() if agent.proc.poll() is not None}
    assert not exited, f"agents exited during the alarm: {exited}\n{ctx.job.stderr_tails()}"
    clear_nospace(address(ctx))
    return Timeline(at, time.time())


@pytest.mark.parametrize("launcher", WITH_LIVE)
def test_a_worker_crash_while_etcd_is_full_re_forms_once_it_is_cleaned(launcher, etcd_cluster_factory, job_factory,
                                                                       report_figures):
    scenario = Scenario("nospace-crash", crash_while_full, etcd_members=1, worlds=(2, 2), rounds=(2, 2), charged=1)
    job = job_factory(launcher, steps=scenario.steps, step_seconds=scenario.step_seconds)
    run(scenario, launcher, etcd_cluster_factory(1, extra_args=QUOTA), job, report_figures)
    no_tracebacks(job)
    assert any(said(job, "etcd is out of space for").values()), job.stderr_tails()
    assert any(said(job, "alarm disarm").values())


# -- item 3: high latency ------------------------------------------------------------------------
@dataclass(frozen=True)
class Proxied:
    """The cluster as the agents see it: through the proxy (faults act on the cluster itself)."""

    cluster: EtcdCluster
    proxy: LatencyProxy

    def endpoints(self, host: str = "127.0.0.1") -> str:
        return f"http://{self.proxy.address}"

    def __getattr__(self, name: str):
        return getattr(self.cluster, name)


@pytest.mark.parametrize("delay", [0.0, 0.2, 1.0], ids=["0ms", "200ms", "1s"])
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_slow_link_to_etcd_still_trains_and_re_forms_after_a_crash(launcher, delay, etcd_cluster_factory,
                                                                     job_factory, report_figures):
    cluster = etcd_cluster_factory(1)
    scenario = Scenario(f"latency-{delay:g}s-crash", lambda ctx: Timeline(crash_worker(ctx)), etcd_members=1,
                        worlds=(2, 2), rounds=(2, 2), charged=1)
    with LatencyProxy(("127.0.0.1", cluster.members[0].client_port), delay) as proxy:
        job = job_factory(launcher, steps=scenario.steps, step_seconds=scenario.step_seconds)
        run(scenario, launcher, Proxied(cluster, proxy), job, report_figures)
    no_tracebacks(job)
    if delay >= 1.0:  # a 2 s round trip is above the 3 s lease's share: each node says what it raised
        assert said(job, "too slowly for the configured timeouts") == {"a": True, "b": True}, job.stderr_tails()


# -- item 4: an operator deletes the job's keys --------------------------------------------------
def delete_job_keys(ctx: Context) -> Timeline:
    """``etcdctl del --prefix /elastic/<run id>/``."""
    prefix = f"/elastic/{ctx.job.run_id}/".encode()
    at = time.time()
    with grpc.insecure_channel(address(ctx)) as channel:
        deleted = etcdrpc.KVStub(channel).DeleteRange(
            etcdrpc.DeleteRangeRequest(key=prefix, range_end=prefix[:-1] + b"0"), timeout=10).deleted
    assert deleted >= 3, f"only {deleted} keys under {prefix!r}"
    return Timeline(at)


@pytest.mark.parametrize("launcher", [ELASTICRUN, ELASTICRUN_LIVE, TORCHRUN])
def test_deleting_the_jobs_keys_re_forms_and_every_agent_says_why(launcher, etcd_cluster_factory, job_factory,
                                                                 report_figures):
    scenario = Scenario("keys-deleted", delete_job_keys, etcd_members=1, worlds=(2, 2), rounds=(2, 2),
                        steps=STEPS_INSTANT)
    job = job_factory(launcher, steps=scenario.steps, step_seconds=scenario.step_seconds)
    run(scenario, launcher, etcd_cluster_factory(1), job, report_figures)
    assert said(job, "the job's keys were deleted") == {"a": True, "b": True}, job.stderr_tails()


# -- an operator revokes one agent's lease -------------------------------------------------------
def revoke_one_lease(ctx: Context) -> Timeline:
    """``etcdctl lease revoke`` of the lease behind one join key of the newest round."""
    keys = RendezvousKeys("/elastic", ctx.job.run_id)
    prefix = keys.rounds_prefix.encode()
    with grpc.insecure_channel(address(ctx)) as channel:
        found = etcdrpc.KVStub(channel).Range(
            etcdrpc.RangeRequest(key=prefix, range_end=prefix[:-1] + b"0"), timeout=10).kvs
        joins = sorted((parsed[0], kv.lease) for kv in found
                       if kv.lease and (parsed := keys.parse_node_key(kv.key.decode())) is not None)
        assert joins, f"no join key with a lease under {prefix!r}"
        at = time.time()
        etcdrpc.LeaseStub(channel).LeaseRevoke(etcdrpc.LeaseRevokeRequest(ID=joins[-1][1]), timeout=10)
    return Timeline(at)


REVOKED_UNDER_TORCHRUN = pytest.mark.xfail(strict=False, raises=AssertionError, reason=(
    "flaky, 3 of 4 runs: torch's agent on the revoked node saw its worker fail (its peer had stopped) before "
    "our plugin's membership change and charged a restart, so the nodes disagree on the restart count (worlds "
    "2->2->2, as in test_chaos's agent-sigstop); our plugin cannot change that; not strict"))


@pytest.mark.parametrize("launcher", [ELASTICRUN, ELASTICRUN_LIVE, pytest.param(TORCHRUN, marks=REVOKED_UNDER_TORCHRUN)])
def test_revoking_one_agents_lease_re_forms_once_and_charges_nothing(launcher, etcd_cluster_factory, job_factory,
                                                                     report_figures):
    scenario = Scenario("lease-revoked", revoke_one_lease, etcd_members=1, worlds=(2, 2), rounds=(2, 2),
                        steps=STEPS_INSTANT)
    job = job_factory(launcher, steps=scenario.steps, step_seconds=scenario.step_seconds)
    run(scenario, launcher, etcd_cluster_factory(1), job, report_figures)
    no_tracebacks(job)
