"""The agent's loop, in-process: a scripted rendezvous (support.fake_rendezvous), fake worker
groups (support.fake_workers) and a fake clock; no process is started.

One case per restart cause (a failure counted, a failure not counted, a membership change, a
store outage) and per outcome (finish, give up, closed by a peer, stop blind, exclusion, a
rendezvous error, a signal in the watch, the rendezvous and the exit barrier). Signals are real:
the test process sends itself SIGUSR2, which the agent catches for the test's duration.
"""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time

import pytest

from elastic.agent.agent import AgentResult, ElasticAgent
from elastic.agent.exclusion import ExclusionPolicy
from elastic.agent.observe.events import EventLog
from elastic.agent.observe.metrics import RESTARTS_TOTAL, AgentMetrics
from elastic.agent.observe.report import AgentReport
from elastic.agent.waking import Waker
from elastic.config import Entrypoint, LaunchConfig
from elastic.rendezvous.api import MembershipChange
from elastic.rendezvous.errors import RendezvousClosedError, RendezvousConnectionError
from elastic.rendezvous.settings import RendezvousSettings
from elastic.rendezvous.static import StaticRendezvousHandler

from support.fake_rendezvous import BLOCK, FakeRendezvous, Round
from support.fake_workers import Fate, FakeGroup, FakeGroups

pytestmark = pytest.mark.timeout(30)  # a loop that does not end fails fast

SIG = signal.SIGUSR2
LEASE_TTL = 10.0
AB = ("a", "b")
METRIC_IDS = {"run_id": "job", "node": "a"}  # the identity labels of the loop's metrics


class FakeTime:
    """A monotonic clock that moves only when the agent waits, with actions due at given times."""

    def __init__(self) -> None:
        self.now = 100.0
        self._due: list[tuple[float, object]] = []

    def clock(self) -> float:
        return self.now

    def after(self, delay: float, action) -> None:
        """Run ``action`` once the clock has moved ``delay`` seconds on from now."""
        self._due.append((self.now + delay, action))

    def advance(self, timeout: float) -> None:
        """Move to the first due action within ``timeout`` (running the actions due then), or by ``timeout``."""
        target = self.now + max(timeout, 0.0)
        due = [at for at, _ in self._due if at <= target]
        self.now = min(due) if due else target
        for item in [item for item in self._due if item[0] <= self.now]:
            self._due.remove(item)
            item[1]()


class SteppingWaker(Waker):
    """A real waker whose timed waits do not sleep: the fake clock jumps instead (a wake, a signal
    or a due action ends the wait, as for real). Untimed waits (the agent's blocking calls) are real."""

    def __init__(self, fake_time: FakeTime) -> None:
        super().__init__()
        self._time = fake_time

    def wait(self, timeout: float | None) -> bool:
        if timeout is None:
            return super().wait(None)
        if super().wait(0):
            return True
        self._time.advance(timeout)
        return super().wait(0)


def kill_self() -> None:
    os.kill(os.getpid(), SIG)


class Loop:
    """Runs one agent over a fake rendezvous and fake groups; keeps what it told."""

    def __init__(self, tmp_path) -> None:
        self.time = FakeTime()
        self.waker = SteppingWaker(self.time)
        self.path = tmp_path / "events.jsonl"
        self.console = io.StringIO()
        self.metrics = AgentMetrics(**METRIC_IDS)
        self.started_at = 0.0

    def run(self, rendezvous, groups: FakeGroups, *, max_restarts: int = 3, exclusion: ExclusionPolicy | None = None,
            monitor_interval: float = 1.0, waker: Waker | None = None, already_finished_ok: bool = False) -> AgentResult:
        config = LaunchConfig(min_nodes=1, max_nodes=3, nproc_per_node=1, entrypoint=Entrypoint("command", "true"),
                              max_restarts=max_restarts, monitor_interval=monitor_interval, shutdown_timeout=1.0,
                              exit_barrier_timeout=5.0,
                              rendezvous=RendezvousSettings("none", 1, 3, lease_ttl=LEASE_TTL,
                                                            already_finished_ok=already_finished_ok))
        waker = waker or self.waker
        with EventLog(self.path, run_id="job", node="a", host="host-a") as events:
            report = AgentReport(events, self.metrics, self.console, run_id=rendezvous.run_id, host="host-a")
            agent = ElasticAgent(config, rendezvous, report, exclusion=exclusion, groups=groups, waker=waker,
                                 clock=self.time.clock)
            self.started_at = self.time.now
            with waker.catching((SIG.name,)):
                return agent.run()

    def events(self, name: str | None = None) -> list[dict]:
        records = [json.loads(line) for line in self.path.read_text().splitlines()]
        return [r for r in records if name is None or r["event"] == name]

    def restarts(self) -> list[tuple[str, int]]:
        return [(r["cause"], r["restart_count"]) for r in self.events("restart")]

    def finished(self) -> str:
        [record] = self.events("job_finished")
        return record["status"]

    def restarts_metric(self, cause: str) -> float:
        return self.metrics.registry.get_sample_value(RESTARTS_TOTAL, {"cause": cause, **METRIC_IDS})


@pytest.fixture
def loop(tmp_path):
    return Loop(tmp_path)


# -- restart causes ------------------------------------------------------------------------------

def test_a_failure_restarts_at_once_and_counts_when_the_next_round_charges_it(loop):
    rendezvous = FakeRendezvous([Round(AB), Round(AB, restart_count=1, culprit="a")])
    groups = FakeGroups([Fate.FAIL, Fate.SUCCEED])

    result = loop.run(rendezvous, groups)

    assert result == AgentResult(0, "workers finished")
    assert rendezvous.calls == ["next_rendezvous", "report_failure", "next_rendezvous", "declare_finished", "finish",
                                "shutdown"]
    assert loop.restarts() == [("worker_failure", 1)]
    assert [(g.attempt, g.restart_count) for g in groups.made] == [(0, 0), (1, 1)]
    assert "worker rank 0 failed (exit code 1); restart 1 of 3" in loop.console.getvalue()
    assert loop.restarts_metric("worker_failure") == 1 and loop.restarts_metric("membership_change") == 0


def test_a_failure_is_not_counted_when_a_member_of_its_round_is_absent_from_the_next(loop):
    rendezvous = FakeRendezvous([Round(AB), Round(("a",))])  # b died, and broke our collectives first
    groups = FakeGroups([Fate.FAIL, Fate.SUCCEED])

    assert loop.run(rendezvous, groups).exit_code == 0

    assert len(rendezvous.failures) == 1  # reported: the closer decides
    assert loop.restarts() == [("membership_change", 0)]
    [lost] = loop.events("member_lost")
    assert lost["reason"] == "worker failure not counted: b, a member of the previous round, is absent from round 1"
    assert groups.made[1].restart_count == 0
    assert "restart 1 of" not in loop.console.getvalue()


def test_without_a_round_record_the_node_counts_its_own_failures(loop):
    groups = FakeGroups([Fate.FAIL, Fate.FAIL, Fate.SUCCEED])

    result = loop.run(StaticRendezvousHandler("job", 2, 0, "127.0.0.1", 29500), groups)

    assert result.exit_code == 0
    assert loop.restarts() == [("worker_failure", 1), ("worker_failure", 2)]
    assert [g.restart_count for g in groups.made] == [0, 1, 2]


def test_without_a_round_record_a_failure_beside_a_lost_member_is_not_counted(loop):
    rendezvous = FakeRendezvous([Round(AB, agreed=False), Round(("a",), agreed=False)])

    assert loop.run(rendezvous, FakeGroups([Fate.FAIL, Fate.SUCCEED])).exit_code == 0

    assert loop.restarts() == [("membership_change", 0)]
    assert [r["reason"] for r in loop.events("member_lost")] == ["worker failure after the loss of b (absent from round 1)"]


@pytest.mark.parametrize("change, fate, reported", [
    (MembershipChange.NODES_WAITING, Fate.RUN, False),
    (MembershipChange.MEMBER_LOST, Fate.RUN, False),
    (MembershipChange.ROUND_SUPERSEDED, Fate.RUN, False),
    # Our workers failed too: beside peers rejoining it may be ours (the closer decides) ...
    (MembershipChange.NODES_WAITING, Fate.FAIL, True),
    # ... beside a lost member it is that loss's consequence, and not reported.
    (MembershipChange.MEMBER_LOST, Fate.FAIL, False),
])
def test_a_membership_change_restarts_the_workers_uncounted(loop, change, fate, reported):
    rendezvous = FakeRendezvous([Round(AB), Round(("a", "b", "c"))])

    def on_start(group: FakeGroup) -> None:
        if group.attempt == 0:
            rendezvous.change(change, f"{change.value} (test)", waiting=1)

    groups = FakeGroups([fate, Fate.SUCCEED], on_start=on_start)

    assert loop.run(rendezvous, groups).exit_code == 0

    assert loop.restarts() == [("membership_change", 0)]
    assert [r["reason"] for r in loop.events("restart")] == [f"{change.value} (test)"]
    assert bool(rendezvous.failures) is reported
    assert groups.made[0].stopping and groups.made[1].restart_count == 0
    assert loop.restarts_metric("membership_change") == 1 and loop.restarts_metric("worker_failure") == 0


def test_a_change_while_the_workers_run_wakes_the_watch(loop):
    rendezvous = FakeRendezvous([Round(AB), Round(AB)])
    groups = FakeGroups([Fate.RUN, Fate.SUCCEED], on_start=lambda group: group.attempt == 0 and loop.time.after(
        30.0, lambda: rendezvous.change(MembershipChange.MEMBER_LOST, "b's lease expired")))

    assert loop.run(rendezvous, groups, monitor_interval=1000.0).exit_code == 0

    assert loop.time.now - loop.started_at == pytest.approx(30.0)  # not the monitor interval
    assert [r["reason"] for r in loop.events("member_lost")] == ["b's lease expired"]


def test_a_worker_exit_wakes_the_watch_at_once_in_real_time(loop):
    rendezvous = FakeRendezvous([Round(("a",)), Round(("a",), restart_count=1)])
    timer = threading.Timer(0.2, lambda: groups.made[0].exit(0, 1))
    groups = FakeGroups([Fate.RUN, Fate.SUCCEED], on_start=lambda group: group.attempt == 0 and timer.start())
    waker = Waker()
    started = time.monotonic()
    try:
        result = loop.run(rendezvous, groups, monitor_interval=60.0, waker=waker)
    finally:
        timer.cancel()
        waker.close()

    assert result.exit_code == 0 and loop.restarts() == [("worker_failure", 1)]
    assert time.monotonic() - started < 5.0  # not the monitor interval


def test_a_failure_during_a_store_outage_is_recorded_as_an_outage_not_a_membership_change(loop):
    rendezvous = FakeRendezvous([Round(AB), Round(AB)])
    rendezvous.on_join = lambda index: index == 1 and rendezvous.set_outage(0.0)  # the store is back

    def on_start(group: FakeGroup) -> None:
        if group.attempt == 0:
            rendezvous.set_outage(4.0)
            loop.time.after(2.0, lambda: group.exit(0, 1))

    groups = FakeGroups([Fate.RUN, Fate.SUCCEED], on_start=on_start)

    assert loop.run(rendezvous, groups, max_restarts=0).exit_code == 0  # not charged: none were allowed

    assert loop.restarts() == [("store_outage", 0)]
    assert [r["reason"] for r in loop.events("restart")] == ["workers failed while the store did not answer"]
    assert loop.events("member_lost") == [] and loop.events("nodes_waiting") == []
    assert rendezvous.failures == []  # not reported: the closer must not charge it either
    assert loop.restarts_metric("store_outage") == 1
    assert loop.restarts_metric("membership_change") == 0 and loop.restarts_metric("worker_failure") == 0


def test_a_failure_within_the_grace_after_an_outage_is_still_the_outages(loop):
    rendezvous = FakeRendezvous([Round(AB), Round(AB)])

    def on_start(group: FakeGroup) -> None:
        if group.attempt == 0:
            rendezvous.set_outage(4.0)
            loop.time.after(1.0, lambda: rendezvous.set_outage(0.0))
            loop.time.after(1.0 + LEASE_TTL, lambda: group.exit(0, 1))  # within lease TTL + 1 s

    groups = FakeGroups([Fate.RUN, Fate.SUCCEED], on_start=on_start)

    assert loop.run(rendezvous, groups, max_restarts=0).exit_code == 0

    assert loop.restarts() == [("store_outage", 0)]


# -- outcomes ------------------------------------------------------------------------------------

@pytest.mark.parametrize("everyone_finished", [True, False])  # False: the barrier timed out
def test_workers_that_succeed_declare_the_job_finished_before_the_exit_barrier_and_close_nothing_after(
        loop, everyone_finished):
    rendezvous = FakeRendezvous([Round(AB)], finish=everyone_finished)

    assert loop.run(rendezvous, FakeGroups([Fate.SUCCEED])) == AgentResult(0, "workers finished")

    # The finished record already stops every join: closing after the barrier would only retry a
    # store that may be gone (a c10d host that finished first).
    assert rendezvous.calls == ["next_rendezvous", "declare_finished", "finish", "shutdown"]
    assert rendezvous.closed_reasons == []
    assert loop.finished() == "succeeded" and loop.restarts() == []


def test_a_lone_node_out_of_restarts_gives_up_at_once_with_the_root_cause(loop):
    rendezvous = FakeRendezvous([Round(("a",))])

    result = loop.run(rendezvous, FakeGroups([Fate.FAIL]), max_restarts=0)

    assert result == AgentResult(1, "==== Root cause: rank 0 on host-a exited with 1 ====")
    assert rendezvous.closed_reasons == ["node host-a gave up after 0 restarts"]
    assert loop.finished() == "failed" and loop.time.now == loop.started_at
    assert "Root cause: rank 0" in loop.console.getvalue()


def test_out_of_restarts_the_node_gives_a_peers_death_the_lease_ttl_to_show_before_giving_up(loop):
    rendezvous = FakeRendezvous([Round(AB)])

    result = loop.run(rendezvous, FakeGroups([Fate.FAIL]), max_restarts=0)

    assert result.exit_code == 1 and loop.finished() == "failed"
    assert loop.time.now - loop.started_at == pytest.approx(LEASE_TTL + 1.0)


def test_a_peers_loss_within_the_grace_turns_the_last_failure_into_a_membership_restart(loop):
    rendezvous = FakeRendezvous([Round(AB), Round(("a",))])
    groups = FakeGroups([Fate.FAIL, Fate.SUCCEED], on_start=lambda group: group.attempt == 0 and loop.time.after(
        5.0, lambda: rendezvous.change(MembershipChange.MEMBER_LOST, "b's lease expired")))

    assert loop.run(rendezvous, groups, max_restarts=0).exit_code == 0

    assert loop.restarts() == [("membership_change", 0)]
    assert loop.time.now - loop.started_at == pytest.approx(5.0)


def test_workers_that_cannot_start_end_the_job(loop):
    rendezvous = FakeRendezvous([Round(("a",))])

    assert loop.run(rendezvous, FakeGroups([Fate.NO_START])) == AgentResult(1, "workers failed")

    assert "elasticrun: cannot start the workers:" in loop.console.getvalue()
    assert rendezvous.closed_reasons == ["node host-a gave up after 0 restarts"]


def test_a_rendezvous_closed_by_a_peer_stops_the_workers_and_exits_1(loop):
    rendezvous = FakeRendezvous([Round(AB)])
    groups = FakeGroups([Fate.RUN], on_start=lambda group: loop.time.after(
        3.0, lambda: rendezvous.change(MembershipChange.CLOSED, "closed")))

    result = loop.run(rendezvous, groups)

    assert result.exit_code == 1 and "closed by another node" in result.reason
    assert loop.finished() == "closed_by_peer" and groups.made[0].stopping
    assert "set_closed" not in rendezvous.calls and rendezvous.calls[-1] == "shutdown"


def test_a_store_unreachable_past_the_outage_limit_stops_the_workers_blind(loop):
    rendezvous = FakeRendezvous([Round(AB)])
    reason = "the store has not answered a keepalive for 60s; stopping the workers rather than train blind"
    groups = FakeGroups([Fate.RUN], on_start=lambda group: loop.time.after(
        60.0, lambda: rendezvous.change(MembershipChange.STORE_UNREACHABLE, reason)))

    assert loop.run(rendezvous, groups) == AgentResult(1, reason)

    assert loop.finished() == "store_unreachable" and groups.made[0].stopping
    assert loop.restarts() == []


def test_a_node_whose_own_workers_keep_failing_sits_out_the_cooldown_then_rejoins(loop):
    rendezvous = FakeRendezvous([Round(AB), Round(AB)], exclusion=True)
    groups = FakeGroups([Fate.FAIL, Fate.SUCCEED])

    result = loop.run(rendezvous, groups, exclusion=ExclusionPolicy(max_node_failures=1, cooldown=30.0, min_nodes=1))

    assert result.exit_code == 0
    [(cooldown, reason)] = rendezvous.exclusions
    assert cooldown == 30.0 and reason.startswith("its own workers failed 1 times in a row")
    [excluded] = loop.events("node_excluded")
    assert excluded["failures_in_a_row"] == 1
    # The failure's grace (a peer may have died), then the cooldown.
    assert loop.time.now - loop.started_at == pytest.approx(LEASE_TTL + 1.0 + 30.0)
    assert rendezvous.calls.count("is_closed") >= 1 and rendezvous.failures == []
    assert [g.attempt for g in groups.made] == [0, 1] and loop.restarts() == []
    assert loop.metrics.registry.get_sample_value("elastic_node_excluded", METRIC_IDS) == 0


def test_a_job_that_ends_while_the_node_is_excluded_ends_the_node_too(loop):
    rendezvous = FakeRendezvous([Round(AB)], exclusion=True)
    groups = FakeGroups([Fate.FAIL], on_start=lambda group: loop.time.after(
        LEASE_TTL + 5.0, lambda: setattr(rendezvous, "closed", True)))

    result = loop.run(rendezvous, groups, exclusion=ExclusionPolicy(max_node_failures=1, cooldown=30.0, min_nodes=1))

    assert result == AgentResult(0, "the job ended while this node was excluded")
    assert loop.finished() == "closed_while_excluded" and len(groups.made) == 1


@pytest.mark.parametrize("error, exit_code, status", [
    (RendezvousConnectionError("the backend failed during the join"), 1, "rendezvous_error"),
    (RendezvousClosedError("closed", RendezvousClosedError.JOB_FINISHED), 0, "already_finished"),
    (RendezvousClosedError("closed", "node x gave up"), 1, "rendezvous_closed"),
])
def test_a_rendezvous_error_ends_the_agent(loop, error, exit_code, status):
    rendezvous = FakeRendezvous([error])

    result = loop.run(rendezvous, FakeGroups([Fate.SUCCEED]))

    assert result.exit_code == exit_code and loop.finished() == status
    assert rendezvous.calls == ["next_rendezvous", "shutdown"]


# -- signals -------------------------------------------------------------------------------------

def assert_signalled(loop, result, rendezvous) -> None:
    assert result == AgentResult(128 + SIG, f"the agent received {SIG.name}; workers stopped")
    assert loop.finished() == f"signalled:{SIG.name}"
    assert rendezvous.is_shut_down and "set_closed" not in rendezvous.calls


def test_a_signal_while_the_workers_run_is_forwarded_and_ends_the_agent(loop):
    rendezvous = FakeRendezvous([Round(AB)])
    groups = FakeGroups([Fate.RUN], on_start=lambda group: loop.time.after(5.0, kill_self))

    result = loop.run(rendezvous, groups)

    assert_signalled(loop, result, rendezvous)
    assert groups.made[0].signals == [SIG] and groups.made[0].stopping


def test_a_signal_wakes_the_watch_at_once_in_real_time(loop):
    rendezvous = FakeRendezvous([Round(AB)])
    timer = threading.Timer(0.2, kill_self)
    groups = FakeGroups([Fate.RUN], on_start=lambda group: timer.start())
    waker = Waker()
    started = time.monotonic()
    try:
        result = loop.run(rendezvous, groups, monitor_interval=60.0, waker=waker)
    finally:
        timer.cancel()
        waker.close()

    assert_signalled(loop, result, rendezvous)
    assert time.monotonic() - started < 5.0  # not the monitor interval


def test_a_signal_during_the_rendezvous_shuts_the_join_down_and_ends_the_agent(loop):
    rendezvous = FakeRendezvous([BLOCK])
    rendezvous.on_join = lambda index: kill_self()  # in the join's own thread, as a signal may be
    started = time.monotonic()

    result = loop.run(rendezvous, FakeGroups([Fate.SUCCEED]))

    assert_signalled(loop, result, rendezvous)
    assert time.monotonic() - started < 5.0
    assert rendezvous.calls[:2] == ["next_rendezvous", "shutdown"]


def test_a_signal_during_the_exit_barrier_shuts_it_down_and_ends_the_agent(loop):
    rendezvous = FakeRendezvous([Round(AB)], finish=BLOCK)
    rendezvous.on_finish = kill_self
    groups = FakeGroups([Fate.SUCCEED])

    result = loop.run(rendezvous, groups)

    assert_signalled(loop, result, rendezvous)
    assert rendezvous.calls[:4] == ["next_rendezvous", "declare_finished", "finish", "shutdown"]
    assert groups.made[0].signals == []  # already stopped: nothing to forward


def test_a_signal_while_workers_start_stops_them_once_started(loop):
    rendezvous = FakeRendezvous([Round(AB)])
    groups = FakeGroups([Fate.RUN], on_start=lambda group: kill_self())

    result = loop.run(rendezvous, groups)

    assert_signalled(loop, result, rendezvous)
    assert groups.made[0].signals == [SIG] and groups.made[0].stopping
    assert loop.time.now == loop.started_at  # at the first look, not after a monitor interval
