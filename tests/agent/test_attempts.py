"""When an attempt's store goes to the store helper: after its workers are spawned, and not at all
on a node that does not host it (unless templates need it warm); how attempts are numbered, a
kept group moved and a failed worker replaced. Fake groups, a fake helper."""

from __future__ import annotations

import dataclasses
import io
import json
import socket

import pytest

from elastic.agent.attempts import Attempts, NodeHelpers
from elastic.agent.errors import StoreHostError
from elastic.agent.observe.events import EventLog
from elastic.agent.observe.report import AgentReport
from elastic.agent.processes.group_state import GroupStatus, WorkersView
from elastic.agent.waking import Waker
from elastic.rendezvous.api import RendezvousInfo
from elastic.rendezvous.records import Member, NodeLayout

from support.fake_workers import Fate, FakeGroup, FakeGroups


class FakeHelper:
    """Records what the agent asks of its store helper, in order with the groups' starts."""

    def __init__(self, log: list[str], fail: bool = False) -> None:
        self.log = log
        self.fail = fail

    def serve(self, listener: socket.socket, host: str) -> None:
        listener.close()
        if self.fail:
            raise StoreHostError("the store helper could not take port 1")
        self.log.append("serve")

    def warm(self) -> None:
        self.log.append("warm")

    def release(self) -> None:
        self.log.append("release")

    def close(self) -> None:
        self.log.append("close")


class FakeTemplates:
    def wait_ready(self, timeout: float) -> bool:
        return True


def round_info(group_rank: int, listener: socket.socket | None) -> RendezvousInfo:
    members = (Member("a", "h", 1), Member("b", "h", 2))
    layout = NodeLayout(group_rank, 2, 1, group_rank, 2, "default", group_rank, 2)
    return RendezvousInfo("job", 0, group_rank, 2, "h", 1, members, layout=layout, master_listener=listener)


@pytest.fixture
def attempts_of(tmp_path):
    made = []

    def make(helper: FakeHelper | None, templates: FakeTemplates | None = None, log: list[str] | None = None):
        groups = FakeGroups([Fate.RUN], on_start=lambda group: log.append("workers") if log is not None else None)
        events = EventLog(tmp_path / "events.jsonl", run_id="job", node="h")
        report = AgentReport(events, None, io.StringIO(), run_id="job", host="h")
        helpers = NodeHelpers(store_host=helper, templates=templates, warm_store_host=templates is not None)
        attempts = Attempts(groups, Waker(), report, helpers, run_id="job", host="h", shutdown_timeout=1.0)
        made.append((attempts, events))
        return attempts, groups

    yield make
    for attempts, events in made:
        attempts.stop()
        events.close()


def listening() -> socket.socket:
    """A listening socket, as the master port's reservation hands one over."""
    return socket.create_server(("127.0.0.1", 0))


def test_the_master_hands_its_store_to_the_helper_after_its_workers_are_spawned(attempts_of):
    log: list[str] = []
    attempts, groups = attempts_of(FakeHelper(log), log=log)
    listener = listening()
    group = attempts.start(round_info(0, listener), 0)
    assert group is not None and group.use_agent_store
    assert log == ["workers", "serve"]  # the helper's torch import does not slow the workers' start


def test_a_node_that_does_not_host_starts_no_helper_unless_templates_need_it_warm(attempts_of):
    log: list[str] = []
    attempts, _ = attempts_of(FakeHelper(log), log=log)
    assert attempts.start(round_info(1, None), 0).use_agent_store  # its workers are the master's clients
    assert log == ["workers"]

    warm_log: list[str] = []
    prewarmed, _ = attempts_of(FakeHelper(warm_log), FakeTemplates(), log=warm_log)
    prewarmed.start(round_info(1, None), 0)
    assert warm_log == ["workers", "warm"]  # a master move later forks at once: the helper must be ready


def test_a_static_node_that_does_not_host_has_its_workers_use_the_masters_agent_store(attempts_of):
    log: list[str] = []
    attempts, _ = attempts_of(FakeHelper(log), log=log)
    static = dataclasses.replace(round_info(1, None), layout=None)  # no round record: nothing agreed
    assert attempts.start(static, 0).use_agent_store  # as torchrun's static rendezvous, on every node
    assert log == ["workers"]


def test_a_helper_that_cannot_take_the_store_leaves_rank_0_to_host_it_from_the_next_attempt(attempts_of):
    log: list[str] = []
    attempts, _ = attempts_of(FakeHelper(log, fail=True), log=log)
    assert attempts.start(round_info(0, listening()), 0).use_agent_store
    attempts.stop()
    listener = listening()
    assert not attempts.start(round_info(0, listener), 0).use_agent_store
    assert listener.fileno() == -1  # closed: rank 0's worker binds the port itself


def test_each_start_tells_the_event_log_which_local_ranks_started(attempts_of, tmp_path):
    attempts, _ = attempts_of(None)
    attempts.start(round_info(1, None), 0)
    [line] = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert (line["event"], line["round"], line["started"], line["kept"]) == ("workers_started", 0, [0], [])


class KeptGroup(FakeGroup):
    """A fake group whose workers follow rounds and all spoke the live protocol; records the
    rounds it moves to and the replacements asked of it (each with its attempt number)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.moves: list[tuple[int, int]] = []
        self.refills: list[int] = []

    def look(self) -> WorkersView:
        return dataclasses.replace(super().look(), follows_rounds=True, silent=False)

    def refill(self, *, attempt: int, restart_count: int, use_agent_store: bool) -> tuple[int, ...]:
        self.refills.append(attempt)
        return (0,)

    def move_to(self, info: RendezvousInfo, *, attempt: int, restart_count: int,
                use_agent_store: bool) -> tuple[int, ...]:
        self.moves.append((info.round, attempt))
        self.rdzv = info
        return ()


@pytest.fixture
def kept(tmp_path):
    """Attempts over KeptGroups, with pre-warmed templates; yields (attempts, groups made)."""
    made: list[KeptGroup] = []

    def groups(info, *, attempt, restart_count, use_agent_store):
        made.append(KeptGroup(info, attempt=attempt, restart_count=restart_count, use_agent_store=use_agent_store,
                              nproc=1, fate=Fate.RUN))
        return made[-1]

    with EventLog(tmp_path / "events.jsonl", run_id="job", node="h") as events:
        report = AgentReport(events, None, io.StringIO(), run_id="job", host="h")
        attempts = Attempts(groups, Waker(), report, NodeHelpers(templates=FakeTemplates()), run_id="job", host="h",
                            shutdown_timeout=1.0)
        yield attempts, made
        attempts.stop()


def test_each_start_is_the_next_attempt_and_a_kept_group_moves_to_the_new_round(kept):
    attempts, made = kept
    first = attempts.start(round_info(1, None), 0)
    assert attempts.start(dataclasses.replace(round_info(1, None), round=1), 0) is first  # not stopped: kept
    assert [group.attempt for group in made] == [0] and first.moves == [(1, 1)]
    attempts.stop()
    attempts.start(dataclasses.replace(round_info(1, None), round=2), 0)
    assert [group.attempt for group in made] == [0, 2]


def test_a_failed_worker_that_follows_rounds_is_replaced_within_the_look_as_the_next_attempt(kept, tmp_path):
    attempts, made = kept
    group = attempts.start(round_info(1, None), 0)
    group.exit(0, 1)
    assert attempts.look(restart_count=0, restart_left=False).status is GroupStatus.FAILED
    assert group.refills == []  # no restart left: the failure ends the job, nothing to replace
    attempts.look(restart_count=0, restart_left=True)
    assert group.refills == [1]
    attempts.start(dataclasses.replace(round_info(1, None), round=1), 1)
    assert group.moves == [(1, 2)]  # the replacements were attempt 1: the next round's workers get 2
    started = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["started"], e.get("refill", False)) for e in started if e["event"] == "workers_started"] == [
        ([0], False), ([0], True), ([], False)]
