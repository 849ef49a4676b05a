"""A least-privilege etcd user whose tokens lapse every 3 s, under a running job (issue 35, item 1).

The same job and verdict as ``test_chaos.py`` (2 agents x 1 gloo worker, ``elasticrun`` and stock
``torchrun --rdzv-backend=etcd-v3`` with our plugin, the fault once step 10 is done;
:func:`test_chaos.run` judges it), against a single etcd member with auth on and simple tokens
that lapse after 3 s unused (``--auth-token-ttl 3``; etcd's default is 300 s). The job's user is
set up with the ``etcdctl`` lines docs/security.md shows (:mod:`support.etcd_auth`):
readwrite on ``/elastic/`` and nothing else.

Lease renewals and open watches do not renew a token, so while the job trains its agents'
tokens lapse, and the next request after a quiet spell is refused ("invalid auth token"; a watch
created on etcd 3.5 is refused as "permission denied"): at a re-formation, after an etcd restart
(which forgets every token) and at the end of the job. Each must cost a re-authentication, never
a restart, and never a line that blames the password or the permissions. Scenarios:

* ``token-lapse-restart``: the tokens lapse (2 x TTL), then the etcd member is SIGKILLed and
  started again after 5 s: 0 restarts;
* ``token-lapse-crash``: the tokens lapse, node b's worker is SIGKILLed (the one restart that
  crash needs), the tokens lapse again, and the member is restarted as above.

Besides the verdict of ``test_chaos.py``: no agent line mentions a password, a permission or an
auth token (elasticrun runs with ``-v``, every INFO line shown), and etcd's own log shows it
refused at least 4 distinct tokens (the lapses really happened, and were met).
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

import chaoslib
from chaoslib import ELASTICRUN, TORCHRUN
from test_chaos import FAULT_STEP, Context, Scenario, Timeline, run

from support.etcd_auth import JOB_PASSWORD, ROOT_PASSWORD, least_privilege_lines, run_lines
from support.etcd_cluster import EtcdCluster

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.etcd, pytest.mark.needs_torch, pytest.mark.timeout(420)]

TOKEN_TTL = 3
"""etcd's ``--auth-token-ttl`` here: seconds a simple token lives unused."""
USER = "train-job"
PASSWORDS = {ROOT_PASSWORD: "root-secret", JOB_PASSWORD: "job-secret"}
STEPS = FAULT_STEP + 120
"""24 s of training after the fault starts: the faults take 12-25 s, and the tokens must lapse again before the end."""
BLAME = ("permission", "password", "auth token", "rejected user")
"""Words of a line that blames the credentials (the warning about a password over plain http aside)."""
MIN_REFUSED_TOKENS = 4


def lapse() -> None:
    """Let every token lapse: no agent sends a request while its workers train."""
    time.sleep(2 * TOKEN_TTL)


def restart_member(ctx: Context) -> float:
    """SIGKILL the only member and start it again on its port and data after 5 s; returns when it is back."""
    member = ctx.cluster.members[0]
    ctx.cluster.kill(member)
    time.sleep(5)
    ctx.cluster.start(member)
    return time.time()


def lapse_and_restart(ctx: Context) -> Timeline:
    at = time.time()
    lapse()
    return Timeline(at, restart_member(ctx))


def lapse_crash_lapse_and_restart(ctx: Context) -> Timeline:
    lapse()
    steps = [record for record in ctx.job.records() if record.node == "b" and record.event == "step"]
    at = time.time()
    os.kill(steps[-1].pid, signal.SIGKILL)
    reformed = ctx.job.wait_records(lambda records: any(r.event == "step" and r.time > at for r in records), 90)
    assert reformed, f"the job did not train again within 90 s of the crash:\n{ctx.job.stderr_tails()}"
    lapse()
    return Timeline(at, restart_member(ctx))


SCENARIOS = {
    "token-lapse-restart": Scenario("token-lapse-restart", lapse_and_restart, etcd_members=1, steps=STEPS),
    "token-lapse-crash": Scenario("token-lapse-crash", lapse_crash_lapse_and_restart, etcd_members=1, steps=STEPS,
                                  worlds=(2, 2), rounds=(2, 2), charged=1),
}


@pytest.fixture
def least_privilege_etcd(etcd_cluster_factory):
    """One etcd member with 3 s tokens, auth on, and the job's user as docs/security.md sets it up."""
    cluster = etcd_cluster_factory(1, extra_args=(f"--auth-token-ttl={TOKEN_TTL}",))
    run_lines(least_privilege_lines(USER, "/elastic/"), cluster.endpoints(), PASSWORDS)
    return cluster


def refused_tokens(cluster: EtcdCluster) -> set[str]:
    """The distinct tokens etcd's log says it refused as invalid (lapsed, or forgotten by a restart)."""
    found = set()
    for line in cluster.members[0].log_path.read_text(errors="replace").splitlines():
        if "invalid auth token" in line:
            try:
                found.add(json.loads(line).get("token", ""))
            except ValueError:
                continue
    return found


def blaming_lines(job: chaoslib.ChaosJob) -> list[str]:
    """Agent lines (not the workers') that blame the credentials."""
    return [f"{node}: {line}" for node, agent in job.agents.items() for line in agent.stderr.splitlines()
            if not line.startswith("[rank") and "over plain http" not in line
            and any(word in line.lower() for word in BLAME)]


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("launcher", [ELASTICRUN, TORCHRUN])
def test_a_least_privilege_user_whose_token_lapses_every_3s_costs_no_restart(
        launcher, name, least_privilege_etcd, job_factory, tmp_path, report_figures):
    scenario = SCENARIOS[name]
    password = tmp_path / "job-password"
    password.write_text(PASSWORDS[JOB_PASSWORD] + "\n")
    job = job_factory(launcher, steps=scenario.steps, step_seconds=scenario.step_seconds,
                      extra_args=("-v",) if launcher == ELASTICRUN else (),
                      rdzv_conf=f"user={USER},password_file={password}")
    run(scenario, launcher, least_privilege_etcd, job, report_figures)
    assert not blaming_lines(job), "\n".join(blaming_lines(job))
    refused = refused_tokens(least_privilege_etcd)
    report_figures(f"{name:<22} {launcher:<10} etcd refused {len(refused)} lapsed or forgotten tokens")
    assert len(refused) >= MIN_REFUSED_TOKENS, f"etcd refused only {len(refused)} lapsed tokens: {refused}"
