"""Live recovery end to end: real worker processes (workers/live_train.py), real gloo, and a
simulated agent in the test process that hosts each round's TCPStore and writes round lines.

After every recovery the tests check that the parameters were equal on every rank at the start
of every step (a checksum all-reduce in the worker), that every worker that committed a step
logged the same loss and checksum for it, that survivors committed every step exactly once
(they redid none), and that the loss curve equals the undisturbed run's.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from elastic.worker.rounds import Ready, encode_round_line
from live_checks import (
    assert_consistent,
    assert_each_step_once,
    assert_follows_reference,
    assert_no_redo,
    first_step_after,
    gap_after,
    last_step,
    recoveries,
    steps,
    worker_env,
)

START_TIMEOUT = 120.0  # a worker's torch import on a loaded 2-core machine


def _wait_steps(agent, slots, step, timeout=60.0):
    agent.wait_for(lambda: all(last_step(agent.events(slot)) >= step for slot in slots), timeout, f"{slots} at step {step}")


def _wait_ready(agent, slot, event, round_number, timeout=START_TIMEOUT):
    seen: list[Ready] = []

    def arrived():
        seen.extend(agent.ready_lines(slot))
        return any(line.event == event and line.round == round_number for line in seen)

    agent.wait_for(arrived, timeout, f"{slot} {event} round {round_number}")


def _finish(agent, slots, timeout=120.0):
    for slot in slots:
        proc = agent.workers[slot].proc
        agent.wait_for(lambda: proc.poll() is not None, timeout, f"{slot} to exit")
        assert proc.returncode == 0, f"{slot} exited {proc.returncode}\n{agent.describe()}"


def _start(agent, round_):
    for slot in round_.slots:
        agent.start(slot, round_)
    _wait_steps(agent, round_.slots, 0, START_TIMEOUT)


@pytest.mark.slow
def test_a_crashed_worker_is_dropped_and_a_new_one_heals_from_a_survivor(live_agent):
    total = 400  # enough for the survivors to outlast the replacement's start (a torch import)
    agent = live_agent(worker_env(total, step_sleep=0.02))
    _start(agent, agent.new_round(["w0", "w1", "w2"]))
    _wait_steps(agent, ["w0", "w1"], 8)

    agent.kill("w2")
    arrived_smaller = agent.publish(agent.new_round(["w0", "w1"]))
    # As an agent would, start the replacement at once and tell the survivors when it is ready.
    joined = agent.new_round(["w0", "w1", "w3"])
    agent.start("w3", joined)
    _wait_ready(agent, "w3", "joining", joined.number)
    assert last_step(agent.events("w0")) < total - 50, "the survivors finished before the replacement started"
    arrived_larger = agent.publish(joined, ["w0", "w1"])
    _finish(agent, ["w0", "w1", "w3"])

    logs = {slot: agent.events(slot) for slot in ("w0", "w1", "w2", "w3")}
    by_step = assert_consistent(logs)
    assert_follows_reference(by_step, total)
    # A survivor that reached a round's barrier after the regroup window (a loaded machine) is
    # left out of its first generation, joins the next at a step boundary and is healed forward.
    late = any(r["generation"] > 0 for slot in ("w0", "w1") for r in recoveries(logs[slot]))
    for slot in ("w0", "w1"):
        assert_each_step_once(logs[slot])
        rounds = [r["round"] for r in recoveries(logs[slot])]
        assert rounds == sorted(rounds) and sorted(set(rounds)) == [0, 1, 2], rounds
        if late:
            continue
        assert_no_redo(logs[slot])
        assert rounds == [0, 1, 2]
        assert [r["role"] for r in recoveries(logs[slot])][1] == "level"  # nobody was behind after the crash
        _, smaller, larger = recoveries(logs[slot])
        assert arrived_smaller <= smaller["round_arrived"] and arrived_larger <= larger["round_arrived"]
        assert first_step_after(logs[slot], smaller["healed"])["world"] == 2
        assert first_step_after(logs[slot], larger["healed"])["world"] == 3
    joiner = recoveries(logs["w3"])
    assert joiner[0]["role"] == "receiver" and joiner[0]["steps_before"][-1] == 0  # w3, the round's rank 2
    assert len(joiner) == 1 or late, joiner  # re-formed again when a survivor came late
    assert steps(logs["w3"])[0]["step"] == joiner[0]["step"]
    assert_no_redo(logs["w3"], first=joiner[0]["step"])
    assert gap_after(logs["w0"], arrived_smaller) < 5.0
    assert gap_after(logs["w0"], arrived_larger) < 5.0
    # Leak: the group lost to the crash is released at once, not at some later full garbage
    # collection; back at world size 3 a survivor holds the threads and fds it held before the
    # crash. Compared at equal world size: a gloo group holds one socket per peer, and a survivor
    # may have committed a step of round 0 in a smaller generation re-formed after the crash.
    for slot in ("w0", "w1"):
        before = [event for event in steps(logs[slot]) if event["round"] == 0 and event["world"] == 3][-1]
        tail = [event for event in steps(logs[slot]) if event["round"] == 2][-10:]
        assert tail and min(e["threads"] for e in tail) == before["threads"], (slot, before, tail)
        assert min(e["fds"] for e in tail) == before["fds"], (slot, before, tail)


@pytest.mark.slow
def test_a_frozen_peer_is_abandoned_when_the_next_round_arrives_and_heals_when_it_thaws(live_agent):
    total = 400  # the survivors train on through the abandoned group's timeout and the thaw
    lease_ttl = 1.0
    agent = live_agent(worker_env(total, step_sleep=0.02))
    _start(agent, agent.new_round(["w0", "w1", "w2"]))
    _wait_steps(agent, ["w0", "w1", "w2"], 8)
    before = steps(agent.events("w0"))[-1]

    frozen_at = agent.freeze("w2")
    time.sleep(lease_ttl)  # the frozen node's lease expires; the other agents close the next round
    arrived = agent.publish(agent.new_round(["w0", "w1"]))
    _wait_steps(agent, ["w0", "w1"], last_step(agent.events("w0")) + 5)
    gap = gap_after(agent.events("w0"), arrived)
    # The abandoned group's works end at the collective timeout (5 s); its threads and sockets with them.
    _wait_steps(agent, ["w0", "w1"], last_step(agent.events("w0")) + 1)
    agent.wait_for(lambda: steps(agent.events("w0"))[-1]["hung"] == 0, 20.0, "w0's abandoned works to end")
    assert last_step(agent.events("w0")) < total - 50, "the survivors finished before the thaw"

    agent.thaw("w2")  # the node comes back: its old group is gone, it waits for a round and heals
    rejoined = agent.new_round(["w0", "w1", "w2"])
    agent.publish(rejoined)
    _finish(agent, ["w0", "w1", "w2"])

    logs = {slot: agent.events(slot) for slot in ("w0", "w1", "w2")}
    by_step = assert_consistent(logs)
    assert_follows_reference(by_step, total)
    for slot in ("w0", "w1"):
        causes = [r["cause"] for r in recoveries(logs[slot])]
        # Round 2 reaches each survivor at a step boundary ("round"), unless the other survivor
        # read it first and left round 1's group under it, failing its collective ("lost").
        # A survivor that reached a round's barrier after the regroup window (a loaded machine) is
        # left out of its first generation and joins the next at a step boundary: the others
        # ("regroup") trained on without it, and it is healed forward past their steps. So each
        # round has one first formation per rank, then re-formings of it.
        firsts = {}
        for r in recoveries(logs[slot]):
            assert r["round"] >= max(firsts, default=0), causes
            if r["round"] in firsts:  # "lost" when the other rank left for the regroup first
                assert r["cause"] in ("regroup", "lost"), causes
            firsts.setdefault(r["round"], r["cause"])
        assert firsts.keys() == {0, 1, 2} and firsts[0] == "start" and firsts[1] == "lost", causes
        assert firsts[2] in ("round", "lost"), causes
        assert_each_step_once(logs[slot])
    thawed = recoveries(logs["w2"])
    assert [r["round"] for r in thawed][:2] == [0, 2] and thawed[1]["role"] == "receiver"
    assert all(r["round"] == 2 for r in thawed[2:]), thawed  # re-formed again when a survivor came late
    assert gap < 3.0, f"the survivor's first step came {gap:.2f}s after the round arrived"
    # Leak: while the abandoned group's collective runs it keeps its threads and sockets; once the
    # collective timeout ends it, they are released, and with the same world size the survivor
    # is back to its threads and fds of before the freeze.
    # The healed round's first steps may still hold the transfer's socket or a gloo thread on its
    # way out, so "back" is judged on its last ten steps: a leak stays in every one of them.
    during = next(event for event in steps(logs["w0"]) if event["round"] == 1)
    tail = [event for event in steps(logs["w0"]) if event["round"] == 2][-10:]
    assert during["hung"] == 1 and during["threads"] > before["threads"], (before, during)
    assert tail and min(event["threads"] for event in tail) == before["threads"], (before, tail)
    assert min(event["fds"] for event in tail) <= before["fds"], (before, tail)
    assert frozen_at < arrived


def test_a_new_round_with_the_same_members_reforms_without_a_transfer(live_agent):
    total = 30
    agent = live_agent(worker_env(total))
    first = agent.new_round(["w0", "w1"])
    _start(agent, first)
    _wait_steps(agent, ["w0", "w1"], 5)
    arrived = agent.publish(agent.new_round(["w0", "w1"]))
    _finish(agent, ["w0", "w1"])

    logs = {slot: agent.events(slot) for slot in ("w0", "w1")}
    assert_follows_reference(assert_consistent(logs), total)
    for slot in ("w0", "w1"):
        assert_no_redo(logs[slot])
        again = recoveries(logs[slot])[1]
        assert (again["round"], again["role"], again["nbytes"]) == (1, "level", 0)
        # "lost" when the other rank took the round first and left round 0's group under this one.
        assert again["cause"] in ("round", "lost")
        assert gap_after(logs[slot], arrived) < 3.0
        # A rank whose peer left round 0 for round 1 under it tells its agent nothing: the peer
        # ended round 0's generations first, and the round it left for is on its way.
        ready = [(line.event, line.round, line.step) for line in agent.ready_lines(slot)]
        assert ready == [("joining", 0, 0), ("formed", 0, 0), ("formed", 1, again["step"])]


@pytest.mark.slow  # the watcher's handling of garbage is also covered in-process (test_channel.py)
def test_garbage_on_the_round_pipe_is_ignored_with_one_warning_per_line(live_agent):
    total = 30
    agent = live_agent(worker_env(total))
    first = agent.new_round(["w0", "w1"])
    _start(agent, first)
    _wait_steps(agent, ["w0", "w1"], 3)
    garbage = [
        b"not json\n",
        b"\xff\xfe\x00 binary\n",
        b"[1, 2, 3]\n",
        b'{"v": 2, "round": 9}\n',
        b'{"v": 1, "round": 9}\n',
        b"x" * 100_000 + b"\n",  # over the 64 KiB bound
    ]
    for data in garbage:
        agent.write("w0", data)
    agent.write("w0", encode_round_line(first.for_slot("w0")))  # the round in use again: ignored quietly
    _wait_steps(agent, ["w0", "w1"], last_step(agent.events("w0")) + 3)
    agent.publish(agent.new_round(["w0", "w1"]))  # the pipe still works after the garbage
    _finish(agent, ["w0", "w1"])

    logs = {slot: agent.events(slot) for slot in ("w0", "w1")}
    assert_follows_reference(assert_consistent(logs), total)
    assert [r["round"] for r in recoveries(logs["w0"])] == [0, 1]
    stderr = agent.workers["w0"].stderr.read_text()
    assert stderr.count("ignored a bad line on the round pipe") == 5
    assert stderr.count("over the 65536-byte limit") == 1


def test_a_closed_round_pipe_keeps_training_until_a_collective_fails_then_exits_non_zero(live_agent):
    agent = live_agent(worker_env(10_000))
    first = agent.new_round(["w0", "w1"])
    _start(agent, first)
    agent.close_pipe("w0")
    agent.close_pipe("w1")
    at_eof = last_step(agent.events("w0"))
    _wait_steps(agent, ["w0", "w1"], at_eof + 10)  # the agent is gone; training goes on

    killed_at = agent.kill("w1")
    proc = agent.workers["w0"].proc
    agent.wait_for(lambda: proc.poll() is not None, 20.0, "w0 to exit")
    failed = [event for event in agent.events("w0") if event["ev"] == "failed"]
    assert proc.returncode == 1 and failed and failed[0]["type"] == "AgentGoneError"
    assert failed[0]["t"] - killed_at < 3.0
    assert "round pipe is closed" in agent.workers["w0"].stderr.read_text()


@pytest.mark.slow
def test_a_survivor_trains_on_alone_and_a_slow_replacement_joins_at_a_later_step(live_agent):
    # Issue 37: survivors do not wait for a replacement that is not ready. The survivor of a
    # crash closes the round's next generation alone once the regroup window has passed; the
    # replacement, started long after (a GPU's start-up), moves the round to a newer generation,
    # which the survivor sees in the store and joins at its next step boundary, no round needed.
    total = 400
    agent = live_agent(worker_env(total, step_sleep=0.02))
    first = agent.new_round(["w0", "w1"])
    _start(agent, first)
    _wait_steps(agent, ["w0", "w1"], 8)
    killed_at = agent.kill("w1")
    _wait_steps(agent, ["w0"], last_step(agent.events("w0")) + 30)  # alone, with no replacement in sight
    assert last_step(agent.events("w0")) < total - 100, "the survivor finished before the replacement started"
    agent.start("w2", dataclasses.replace(first, slots=("w0", "w2")), extra_env={"ELASTIC_REFILL": "1"})
    _finish(agent, ["w0", "w2"])

    logs = {slot: agent.events(slot) for slot in ("w0", "w1", "w2")}
    assert_follows_reference(assert_consistent(logs), total)
    assert_no_redo(logs["w0"])
    assert first_step_after(logs["w0"], killed_at)["world"] == 1 and steps(logs["w0"])[-1]["world"] == 2
    formed = [(r["round"], r["generation"], r["cause"], r["members"]) for r in recoveries(logs["w0"])]
    assert formed == [(0, 0, "start", [0, 1]), (0, 1, "lost", [0]), (0, 2, "regroup", [0, 1])], formed
    joined = recoveries(logs["w2"])
    assert [(r["generation"], r["role"], r["members"]) for r in joined] == [(2, "receiver", [0, 1])], joined
    assert steps(logs["w2"])[0]["step"] == joined[0]["step"]
    ready = [(line.event, line.round) for line in agent.ready_lines("w0")]
    assert ready == [("joining", 0), ("formed", 0), ("lost", 0), ("formed", 0), ("formed", 0)], ready
    assert len(agent.rounds) == 1


@pytest.mark.slow
def test_a_group_lost_after_a_stall_does_not_go_on_without_the_stalled_peer(live_agent):
    # A peer that froze or was cut off may train elsewhere when it is back (its node's lease
    # expires, the next round leaves it out, ...): a survivor whose collective stalled before it
    # failed re-forms the round only with every rank, and with no newer round exits at the deadline.
    options = '{"collective_timeout": 2, "store_timeout": 5, "round_wait_timeout": 1.5, "interrupt_grace": 0.5}'
    agent = live_agent(worker_env(10_000, options=options))
    _start(agent, agent.new_round(["w0", "w1"]))
    _wait_steps(agent, ["w0", "w1"], 3)
    frozen_at = agent.freeze("w1")
    proc = agent.workers["w0"].proc
    agent.wait_for(lambda: proc.poll() is not None, 30.0, "w0 to exit")
    events = agent.events("w0")
    failed = [event for event in events if event["ev"] == "failed"]
    assert proc.returncode == 1 and failed[0]["type"] == "NoRoundError", failed
    assert failed[0]["t"] - frozen_at >= 2.0 + 1.5  # the collective timeout, then the deadline
    assert all(event["world"] == 2 for event in steps(events)), "the survivor trained without its stalled peer"


@pytest.mark.slow
def test_a_replaced_worker_rejoins_its_round_as_a_new_generation_without_a_new_round(live_agent):
    # What the agent does for a worker crash (issue 29): it starts the replacement in the round
    # in use at once (ELASTIC_REFILL=1), and the ranks re-form it through its own store, so a
    # rendezvous that is slow or electing an etcd leader costs training nothing.
    total = 1000  # the survivors no longer wait for a replacement: enough steps to outlast two cold starts
    agent = live_agent(worker_env(total, step_sleep=0.02))
    first = agent.new_round(["w0", "w1", "w2"])
    _start(agent, first)
    _wait_steps(agent, ["w0", "w1", "w2"], 8)

    killed_at = agent.kill("w2")
    agent.start("w3", dataclasses.replace(first, slots=("w0", "w1", "w3")), extra_env={"ELASTIC_REFILL": "1"})
    _wait_steps(agent, ["w3"], last_step(agent.events("w0")) + 5, START_TIMEOUT)
    agent.kill("w3")  # the replacement's own replacement: its predecessor formed the generation in use
    agent.start("w4", dataclasses.replace(first, slots=("w0", "w1", "w4")), extra_env={"ELASTIC_REFILL": "1"})
    agent.wait_for(lambda: recoveries(agent.events("w4")), START_TIMEOUT, "w4 to form")
    assert last_step(agent.events("w0")) < total - 20, "the survivors finished before the second replacement"
    _finish(agent, ["w0", "w1", "w4"])

    logs = {slot: agent.events(slot) for slot in ("w0", "w1", "w2", "w3", "w4")}
    by_step = assert_consistent(logs)
    assert_follows_reference(by_step, total)
    for slot in ("w0", "w1"):
        # A survivor that arrived late at a generation (the other one closed it alone after the
        # window) receives the steps the other trained meanwhile: it skips them, never redoes one.
        assert_each_step_once(logs[slot])
        formed = [(r["round"], r["generation"], r["cause"]) for r in recoveries(logs[slot])]
        assert formed[0] == (0, 0, "start") and {round_ for round_, _, _ in formed} == {0}, formed
        generations = [generation for _, generation, _ in formed]
        assert generations == sorted(set(generations)) and len(formed) >= 3, formed
        # The survivors do not wait for the replacement's start (a cold torch import here): they
        # train on as two (issue 37), and take it in at a step boundary once it arrives.
        assert first_step_after(logs[slot], killed_at)["world"] == 2
        # Taken in at a step boundary ("lost" when the other survivor left their group first,
        # under this one): with all three, possibly after a formation of two when a survivor
        # arrived after the regroup window (a loaded machine) and joined at the next boundary.
        after = [r for r in recoveries(logs[slot]) if r["formed"] > recoveries(logs["w4"])[0]["began"]]
        whole = [r for r in after if r["members"] == [0, 1, 2]]
        assert whole and all(r["cause"] in ("regroup", "lost") for r in after[:after.index(whole[0]) + 1]), after
    for slot, predecessor in (("w3", "w2"), ("w4", "w3")):
        joined = recoveries(logs[slot])
        assert (joined[0]["round"], joined[0]["cause"], joined[0]["role"]) == (0, "start", "receiver"), joined
        # Formed with one survivor when the other came after the window: all three re-form at the
        # next step boundary.
        assert all((r["round"], r["cause"]) in ((0, "regroup"), (0, "lost")) for r in joined[1:]), joined
        assert joined[0]["generation"] > max(r["generation"] for r in recoveries(logs[predecessor]))
        # Formed with a survivor: both, or one when the other came after the regroup window.
        survivors = {r["generation"] for survivor in ("w0", "w1") for r in recoveries(logs[survivor])}
        assert joined[0]["generation"] in survivors
        assert steps(logs[slot])[0]["step"] == joined[0]["step"]
    assert len(agent.rounds) == 1
