"""The job's end, in-process (issue 26 item 6): the first node whose workers all succeed ends the
job for every node; a node whose workers fail after that, or that joins after it, exits 0
without training again, and says so in one line.

Same fakes as ``test_agent_loop.py`` (a scripted rendezvous, fake groups, a fake clock).
"""

from __future__ import annotations

import logging

import pytest

from elastic.agent.agent import AgentResult
from elastic.agent.decisions import REJOIN_GRACE_S
from elastic.rendezvous.api import MembershipChange
from elastic.rendezvous.errors import JobFinishedError
from test_agent_loop import AB, Loop

from support.fake_rendezvous import FakeRendezvous, Round
from support.fake_workers import Fate, FakeGroup, FakeGroups

pytestmark = pytest.mark.timeout(30)

ENDED = "the job finished on node b in round 0"


@pytest.fixture
def loop(tmp_path):
    return Loop(tmp_path)


def finished_error() -> JobFinishedError:
    return JobFinishedError("Rendezvous job: the job finished on node b in round 0", "b", 0)


def test_a_failure_after_a_peer_finished_the_job_ends_the_node_with_0_instead_of_a_restart(loop, caplog):
    rendezvous = FakeRendezvous([Round(AB), Round(AB)])

    def on_start(group: FakeGroup) -> None:  # b's workers succeed: ours fail on the collective it left
        rendezvous.change(MembershipChange.JOB_FINISHED, ENDED)
        group.exit(0, 1)

    with caplog.at_level(logging.WARNING):
        result = loop.run(rendezvous, FakeGroups([Fate.RUN, Fate.SUCCEED], on_start=on_start))

    reason = f"{ENDED}; this node's workers failed after that, most likely because their peers left: not training again"
    assert result == AgentResult(0, reason)
    assert loop.finished() == "finished_elsewhere" and loop.restarts() == []
    assert rendezvous.calls == ["next_rendezvous", "shutdown"]  # no rejoin, no failure report, no close
    assert [r.getMessage() for r in caplog.records if "not training again" in r.getMessage()] == [
        f"Run job node host-a: {reason}"]


def test_workers_still_running_when_a_peer_finished_the_job_may_finish_too(loop):
    rendezvous = FakeRendezvous([Round(AB)])

    def on_start(group: FakeGroup) -> None:
        rendezvous.change(MembershipChange.JOB_FINISHED, ENDED)
        loop.time.after(20.0, lambda: group.exit(0, 0))  # they finish their last steps

    groups = FakeGroups([Fate.RUN], on_start=on_start)

    assert loop.run(rendezvous, groups) == AgentResult(0, "workers finished")
    assert not groups.made[0].stopping or loop.time.now - loop.started_at >= 20.0
    assert rendezvous.calls == ["next_rendezvous", "declare_finished", "finish", "shutdown"]


def test_workers_of_a_round_without_the_finisher_are_stopped_and_the_node_exits_0(loop):
    rendezvous = FakeRendezvous([Round(AB)])
    groups = FakeGroups([Fate.RUN], on_start=lambda group: rendezvous.change(
        MembershipChange.JOB_FINISHED_ELSEWHERE, "the job finished on node c in round 3"))

    result = loop.run(rendezvous, groups)

    assert result.exit_code == 0 and "not training again" in result.reason
    assert groups.made[0].stopping and loop.finished() == "finished_elsewhere"


def test_a_failure_whose_rejoin_meets_the_jobs_end_exits_0_without_training_again(loop):
    # The failure is seen before the finished record: the node rejoins, and the join is refused.
    rendezvous = FakeRendezvous([Round(AB), finished_error()])

    result = loop.run(rendezvous, FakeGroups([Fate.FAIL]))

    assert result == AgentResult(0, f"{ENDED}; this node's workers failed after that, most likely because their "
                                    "peers left: not training again")
    assert loop.finished() == "finished_elsewhere"
    assert rendezvous.calls == ["next_rendezvous", "report_failure", "next_rendezvous", "shutdown"]


@pytest.mark.parametrize("joined, ok, code, says, status", [
    (False, False, 3, f"{ENDED} before this node arrived; nothing to do, exit code 3 (use a new --rdzv-id",
     "already_finished"),
    (False, True, 0, f"{ENDED} before this node arrived; nothing to do (use a new --rdzv-id", "already_finished"),
    (True, False, 0, f"{ENDED} while this node waited to join; it trained nothing", "finished_while_waiting"),
])
def test_a_node_in_no_round_exits_3_only_when_it_arrived_after_the_jobs_end(loop, joined, ok, code, says, status):
    finished = JobFinishedError("Rendezvous job: the job finished on node b in round 0", "b", 0, joined=joined)
    rendezvous = FakeRendezvous([finished])

    result = loop.run(rendezvous, FakeGroups([Fate.SUCCEED]), already_finished_ok=ok)

    assert result.exit_code == code and result.reason.startswith(says), result
    assert loop.finished() == status and rendezvous.calls == ["next_rendezvous", "shutdown"]


def test_out_of_restarts_a_failure_beside_the_jobs_end_is_not_a_give_up(loop):
    rendezvous = FakeRendezvous([Round(AB)])
    groups = FakeGroups([Fate.FAIL], on_start=lambda group: loop.time.after(
        1.0, lambda: rendezvous.change(MembershipChange.JOB_FINISHED, ENDED)))

    result = loop.run(rendezvous, groups, max_restarts=0)

    assert result.exit_code == 0 and loop.finished() == "finished_elsewhere"
    assert rendezvous.closed_reasons == []  # nobody closes the rendezvous as failed


# -- a member rejoining while our workers finish -------------------------------------------------
def test_workers_that_finish_within_the_rejoin_grace_finish_the_job_instead_of_restarting(loop):
    # b's workers failed on the collectives ours just finished with; b rejoined at once.
    rendezvous = FakeRendezvous([Round(AB), Round(AB)])

    def on_start(group: FakeGroup) -> None:
        rendezvous.change(MembershipChange.NODES_WAITING, "b rejoins", waiting=1, rejoining=1)
        loop.time.after(REJOIN_GRACE_S - 1.0, lambda: group.exit(0, 0))

    result = loop.run(rendezvous, FakeGroups([Fate.RUN], on_start=on_start))

    assert result == AgentResult(0, "workers finished") and loop.restarts() == []
    assert rendezvous.calls == ["next_rendezvous", "declare_finished", "finish", "shutdown"]


@pytest.mark.parametrize("waiting, rejoining, waited", [
    (1, 1, REJOIN_GRACE_S),  # a member rejoined: ours get the grace, then restart
    (2, 1, 0.0),  # a newcomer too: a scale-up, at once
])
def test_a_rejoin_restarts_running_workers_after_the_grace_and_a_newcomer_at_once(loop, waiting, rejoining, waited):
    rendezvous = FakeRendezvous([Round(AB), Round(AB)])
    groups = FakeGroups([Fate.RUN, Fate.SUCCEED], on_start=lambda group: group.attempt == 0 and rendezvous.change(
        MembershipChange.NODES_WAITING, "waiting", waiting=waiting, rejoining=rejoining))

    assert loop.run(rendezvous, groups).exit_code == 0

    assert loop.restarts() == [("membership_change", 0)]
    assert loop.time.now - loop.started_at == pytest.approx(waited, abs=1.0)
