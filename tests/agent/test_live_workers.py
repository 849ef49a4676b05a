"""Live recovery in the agent: the round pipes, and :class:`LiveWorkers` over real worker
processes (a small script that answers every round it reads, no torch). The decisions' case
tables are in ``test_live_decisions.py``."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import signal
import sys
import termios
import time

import pytest

from elastic.agent.live import pipes as pipes_module
from elastic.agent.live.pipes import MAX_ANSWER_BYTES, LineCutter, RoundPipes
from elastic.agent.live.workers import LiveWorkers, round_for
from elastic.agent.prewarm.pool import ForkedWorker, TemplatePool
from elastic.agent.processes.group_settings import GroupSettings
from elastic.agent.processes.group_state import GroupStatus
from elastic.config import Entrypoint, LaunchConfig, Std, StdMask
from elastic.rendezvous.api import RendezvousInfo
from elastic.worker.rounds import (
    READY_FD_VAR,
    ROUND_FD_VAR,
    ROUND_VAR,
    STORE_PREFIX_VAR,
    Held,
    parse_pipe_line,
    parse_round_line,
)

RUN, FAIL = GroupStatus.RUNNING, GroupStatus.FAILED


# -- the pipes -----------------------------------------------------------------------------------
def _info(round_: int, group_rank: int = 0, group_world_size: int = 1, port: int = 29999) -> RendezvousInfo:
    return RendezvousInfo(run_id="live-unit", round=round_, group_rank=group_rank, group_world_size=group_world_size,
                          master_addr="127.0.0.1", master_port=port, members=())


def _config(nproc: int = 2, script: str = "", timeout: float = 60.0) -> LaunchConfig:
    return LaunchConfig(min_nodes=1, max_nodes=4, nproc_per_node=nproc, entrypoint=Entrypoint("script", script),
                        redirects=StdMask(Std.ALL), live_recovery=True, live_recovery_timeout=timeout)


def test_the_pipes_carry_each_lease_renewal_once_and_never_an_older_one():
    pipes = RoundPipes("test")
    extras = pipes.extras(round_for(_config(), _info(4, 1, 2), 1, restart_count=0))
    reader = os.dup(extras.fds[ROUND_FD_VAR])
    pipes.started()
    try:
        assert pipes.publish_held(Held(10.0)) and pipes.publish_held(Held(10.0)) and pipes.publish_held(Held(9.0))
        assert pipes.publish_held(Held(12.5))
        lines = os.read(reader, 65536).splitlines()
        assert [parse_pipe_line(line) for line in lines] == [Held(10.0), Held(12.5)]
    finally:
        os.close(reader)
        pipes.close()


@pytest.mark.parametrize(
    ("feeds", "lines"),
    [
        ([b"ab\ncd", b"ef\n"], [b"ab", b"cdef"]),
        ([b"x" * 11, b"yy\nok\n"], [None, b"ok"]),  # reported once, as it passes the limit
        ([b"x" * 6, b"x" * 6, b"\nok\n"], [None, b"ok"]),  # passes it across feeds
        ([b"12345678901\nz", b"\n"], [None, b"z"]),
        ([b"1234567890\n"], [b"1234567890"]),  # exactly the limit
        ([b"", b"\n\n"], [b"", b""]),
    ],
)
def test_the_line_cutter_holds_at_most_its_limit_and_drops_longer_lines(feeds, lines):
    cutter = LineCutter(10)
    assert [line for data in feeds for line in cutter.feed(data)] == lines


def test_a_worker_writing_a_deeply_nested_line_or_a_flood_gets_its_next_answer_read(caplog):
    pipes = RoundPipes("test")
    extras = pipes.extras(round_for(_config(), _info(4, 1, 2), 1, restart_count=0))
    writer = os.dup(extras.fds[READY_FD_VAR])
    os.set_blocking(writer, False)
    pipes.started()
    answer = b'{"v":1,"event":"formed","round":4,"rank":3,"step":7}\n'
    try:
        os.write(writer, b"[" * 50_000 + b"\n" + b"[" * 2000 + b"\n" + answer)  # over the limit; under it but too deep
        assert [(a.event, a.round, a.step) for a in pipes.answers()] == [("formed", 4, 7)]
        flooded = 0
        for _ in range(64):  # a worker writing without a newline: each look reads a bounded amount
            try:
                flooded += os.write(writer, b"x" * 65536)
            except BlockingIOError:
                pass
            assert pipes.answers() == []
            assert len(pipes._lines._pending) <= MAX_ANSWER_BYTES
        os.set_blocking(writer, True)
        os.write(writer, b"\n" + answer)
        assert [(a.event, a.round) for a in pipes.answers()] == [("formed", 4)]
        assert flooded > MAX_ANSWER_BYTES
    finally:
        os.close(writer)
        pipes.close()
    warnings = [r.getMessage() for r in caplog.records if "not an answer" in r.getMessage()]
    assert len(warnings) == 1 and "over 4096 bytes" in warnings[0], warnings


def test_one_look_at_the_ready_pipe_reads_a_bounded_amount(monkeypatch):
    monkeypatch.setattr(pipes_module, "MAX_READ_BYTES", 16384)  # a default pipe holds 64 KiB
    pipes = RoundPipes("test")
    extras = pipes.extras(round_for(_config(), _info(4, 1, 2), 1, restart_count=0))
    writer = os.dup(extras.fds[READY_FD_VAR])
    pipes.started()
    try:
        os.write(writer, b"x" * 49152)
        assert pipes.answers() == []
        unread = fcntl.ioctl(pipes._ready_r, termios.FIONREAD, b"\0\0\0\0")
        assert int.from_bytes(unread, sys.byteorder) == 49152 - 16384  # the rest waits in the pipe
    finally:
        os.close(writer)
        pipes.close()


def test_the_pipes_carry_round_lines_one_way_and_answers_the_other():
    pipes = RoundPipes("test")
    first = round_for(_config(), _info(4, 1, 2), 1, restart_count=2)
    extras = pipes.extras(first)
    round_r, ready_w = extras.fds[ROUND_FD_VAR], extras.fds[READY_FD_VAR]
    assert (extras.env[ROUND_VAR], extras.env[STORE_PREFIX_VAR]) == ("4", "etcd-elastic/live/live-unit/round-4")
    reader, writer = os.dup(round_r), os.dup(ready_w)  # the worker's ends, as it inherits them
    pipes.started()  # the agent's copies of the child ends are closed
    try:
        assert pipes.publish(first)
        assert parse_round_line(os.read(reader, 65536)) == first
        assert (first.rank, first.world_size, first.group_rank, first.restart_count) == (3, 4, 1, 2)
        os.write(writer, b'{"v":1,"event":"joining","round":4,"rank":3,"step":0}\ngarbage\n{"v":1,"event":"for')
        assert [(a.event, a.round) for a in pipes.answers()] == [("joining", 4)]
        os.write(writer, b'med","round":4,"rank":3,"step":7}\n')
        assert [(a.event, a.round, a.step) for a in pipes.answers()] == [("formed", 4, 7)]
        os.close(reader)
        reader = -1
        assert not pipes.publish(first)  # the worker is gone: no exception, False
    finally:
        for fd in (reader, writer):
            if fd >= 0:
                os.close(fd)
        pipes.close()
    pipes.close()  # idempotent
    assert not pipes.publish(first)


# -- LiveWorkers over real processes ------------------------------------------------------------
ANSWERING = """
import json, os, sys
out = os.environ["TEST_OUT"]
ready = int(os.environ["ELASTIC_READY_FD"])
mute = os.environ.get("TEST_MUTE") == os.environ["LOCAL_RANK"]
lose = os.environ.get("TEST_LOSE") == os.environ["LOCAL_RANK"]

def note(**event):
    with open(out, "a") as f:
        f.write(json.dumps(dict(event, pid=os.getpid(), local_rank=int(os.environ["LOCAL_RANK"]))) + "\\n")

def answer(round_):
    if not mute:
        os.write(ready, (json.dumps({"v": 1, "event": "formed", "round": round_, "rank": 0, "step": 0}) + "\\n").encode())

note(ev="start", round=int(os.environ["ELASTIC_ROUND"]), rank=int(os.environ["RANK"]),
     refill=os.environ.get("ELASTIC_REFILL", ""))
answer(int(os.environ["ELASTIC_ROUND"]))
if lose:  # its group breaks at once, as when a peer dies: it waits for the next round
    os.write(ready, (json.dumps({"v": 1, "event": "lost", "round": int(os.environ["ELASTIC_ROUND"]), "rank": 0,
                                 "step": 3}) + "\\n").encode())
for line in os.fdopen(int(os.environ["ELASTIC_ROUND_FD"]), "rb"):
    value = json.loads(line)
    note(ev="round", round=value["round"], rank=value["rank"], world=value["world_size"])
    answer(value["round"])
"""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["spawned", "forked"])
def live(request, tmp_path):
    """``live(mute="")``: LiveWorkers of 2 local ranks running the answering script in round 0,
    started normally or forked from pre-warmed templates (``--prewarm``: the pipes ride along)."""
    made: list[LiveWorkers] = []
    pools: list[TemplatePool] = []
    script = tmp_path / "answering.py"
    script.write_text(ANSWERING)
    out = tmp_path / "out.jsonl"

    def make(mute: str = "", timeout: float = 5.0, lose: str = "") -> tuple[LiveWorkers, Clock]:
        clock = Clock()
        environ = dict(os.environ, TEST_OUT=str(out), TEST_MUTE=mute, TEST_LOSE=lose)
        config = _config(script=str(script), timeout=timeout)
        pool = None
        if request.param == "forked":
            pool = TemplatePool(dataclasses.replace(config, prewarm=True, prewarm_modules=("json",)), environ,
                                sys.executable)
            pools.append(pool)
            pool.start()
            assert pool.wait_ready(30)
        settings = GroupSettings(node_id="n0", log_root=str(tmp_path / "logs"), environ=environ,
                                 python=sys.executable, templates=pool)
        workers = LiveWorkers(config, _info(0), attempt=0, restart_count=0, use_agent_store=True, settings=settings,
                              clock=clock)
        made.append(workers)
        workers.start()
        forked = [isinstance(w.proc, ForkedWorker) for group in workers._groups for w in group._workers]
        assert forked == [request.param == "forked"] * 2
        return workers, clock

    make.events = lambda: [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    try:
        yield make
    finally:
        for workers in made:
            workers.stop(timeout=2.0)
        for pool in pools:
            pool.close()


def _until(condition, what: str, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.02)
    return value


def test_a_new_round_is_published_to_running_workers_with_their_new_ranks(live):
    workers, clock = live()
    _until(lambda: len(live.events()) == 2, "both workers started")
    pids = workers.pids()
    assert workers.move_to(_info(1, group_rank=1, group_world_size=2, port=30001), attempt=1, restart_count=0,
                           use_agent_store=True) == ()  # none restarted
    rounds = _until(lambda: [e for e in live.events() if e["ev"] == "round"] if len(live.events()) == 4 else None,
                    "both workers read round 1")
    assert sorted((e["local_rank"], e["round"], e["rank"], e["world"]) for e in rounds) == [(0, 1, 2, 4), (1, 1, 3, 4)]
    assert workers.pids() == pids  # nobody restarted
    _until(lambda: workers.look().formed == 1, "both formed round 1")
    view = workers.look()
    assert view.formed is None and view.status is RUN  # said once
    assert view.follows_rounds and not view.silent and not view.unanswered and not view.broken
    assert workers.global_ranks() == [2, 3]


def test_only_the_dead_worker_restarts_and_it_starts_in_the_new_round(live):
    workers, clock = live()
    _until(lambda: len(live.events()) == 2, "both workers started")
    pids = workers.pids()
    os.kill(pids[1], signal.SIGKILL)
    state = _until(lambda: (s := workers.poll()).status is FAIL and s, "the kill seen")
    assert [failure.local_rank for failure in state.failures] == [1] and state.running == {0}
    assert workers.move_to(_info(1), attempt=1, restart_count=1, use_agent_store=True) == (1,)
    assert workers.pids()[0] == pids[0] and workers.pids()[1] != pids[1]
    assert workers.poll() == type(state)(RUN, (), frozenset({0, 1}))  # the replaced failure is forgotten
    started = _until(lambda: [e for e in live.events() if e["ev"] == "start" and e["pid"] == workers.pids()[1]],
                     "the replacement started")
    assert started[0]["round"] == 1
    _until(lambda: workers.look().formed == 1, "both formed round 1")


def test_a_dead_worker_is_replaced_in_its_round_once_and_its_failure_stays_until_the_next(live):
    workers, clock = live()
    _until(lambda: len(live.events()) == 2, "both workers started")
    _until(lambda: not workers.look().silent, "both workers spoke")
    pids = workers.pids()
    os.kill(pids[1], signal.SIGKILL)
    _until(lambda: workers.look().status is FAIL, "the kill seen")  # a refill acts on the last look
    assert workers.refill(attempt=1, restart_count=0, use_agent_store=True) == (1,)
    assert workers.refill(attempt=2, restart_count=0, use_agent_store=True) == ()  # once per rank and round
    replacement = workers.pids()[1]
    assert workers.pids()[0] == pids[0] and replacement != pids[1]
    view = workers.look()
    # The agent still sees the failure (it reports and counts it at its next join), and both running.
    assert view.status is FAIL and [f.pid for f in view.failures] == [pids[1]] and view.running == {0, 1}
    assert view.replaced and not view.silent  # the replacement speaks as its predecessor did
    started = _until(lambda: [e for e in live.events() if e["ev"] == "start" and e["pid"] == replacement],
                     "the replacement started")
    assert (started[0]["round"], started[0]["refill"]) == (0, "1")
    os.kill(replacement, signal.SIGKILL)  # it died too, in the same round: the next round replaces it
    _until(lambda: len(workers.look().failures) == 2, "the second kill seen")
    assert workers.refill(attempt=2, restart_count=0, use_agent_store=True) == ()
    workers.move_to(_info(1), attempt=2, restart_count=1, use_agent_store=True)
    assert workers.poll().status is RUN and workers.pids()[0] == pids[0]
    again = _until(lambda: [e for e in live.events() if e["ev"] == "start" and e["pid"] == workers.pids()[1]],
                   "the next round's worker started")
    assert (again[0]["round"], again[0]["refill"]) == (1, "")
    _until(lambda: workers.look().formed == 1, "both formed round 1")


def test_a_worker_that_reports_its_group_lost_makes_the_node_rejoin_until_the_next_round(live):
    workers, clock = live(lose="1")
    _until(lambda: len(live.events()) == 2, "both workers started")
    _until(lambda: workers.look().broken, "local rank 1's report that round 0's group broke")
    pids = workers.pids()
    workers.move_to(_info(1), attempt=1, restart_count=0, use_agent_store=True)
    views = [workers.look()]
    _until(lambda: views[-1].formed == 1 or views.append(workers.look()), "both formed round 1")
    assert not any(view.broken for view in views)  # the loss was of round 0: round 1 was being formed
    assert workers.pids() == pids


def test_rounds_numbered_anew_forget_the_answers_of_the_old_numbering(live):
    # An operator deleted the job's keys: the rendezvous starts again at round 0. Local rank 1's
    # loss of the old round 0 must not read as a loss of the new one.
    workers, clock = live(lose="1")
    _until(lambda: len(live.events()) == 2, "both workers started")
    _until(lambda: workers.look().broken, "local rank 1's report that round 0's group broke")
    workers.move_to(_info(3), attempt=1, restart_count=0, use_agent_store=True)
    _until(lambda: workers.look().formed == 3, "both formed round 3")
    workers.move_to(_info(0), attempt=2, restart_count=0, use_agent_store=True)
    # Round 0 of the new numbering is due, not answered by 3, nor lost by the old round 0's report.
    assert [(rank.formed, rank.lost) for rank in workers._ranks.values()] == [(-1, -1), (-1, -1)]
    views = [workers.look()]
    _until(lambda: views[-1].formed == 0 or views.append(workers.look()), "the new round 0")
    assert not any(view.broken for view in views)


def test_a_worker_that_does_not_answer_is_overdue_after_the_deadline(live):
    workers, clock = live(mute="1", timeout=5.0)
    _until(lambda: len(live.events()) == 2, "both workers started")
    _until(lambda: workers.look().silent and workers._ranks[0].spoke, "rank 0's first answer")
    assert not workers._ranks[1].spoke  # the mute one never spoke: a restart would not keep it
    view = workers.look()
    assert not view.unanswered and view.formed is None  # the first round needs no answer
    workers.move_to(_info(1), attempt=1, restart_count=0, use_agent_store=True)
    _until(lambda: len(live.events()) == 4, "both workers read round 1")
    view = workers.look()
    assert not view.unanswered and view.formed is None  # the deadline runs
    clock.now += 5.0
    assert workers.look().unanswered
    assert workers.stop(timeout=2.0).status is GroupStatus.STOPPED
