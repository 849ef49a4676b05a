"""Generations of a round (elastic/worker/refill.py): the key's moves on a real c10d TCPStore,
the end of a round's generations, and the barrier that abandons a generation once the key
moved past it."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from elastic.worker.channel import RoundMailbox
from elastic.worker.errors import WorkerEnvError
from elastic.worker.formation import VERDICT, Verdict, encode_verdict, parse_verdict
from elastic.worker.group import _barrier, _GenerationMoved, _Moved
from elastic.worker.options import LiveOptions
from elastic.worker.refill import (
    GENERATION_KEY,
    GenerationState,
    Move,
    generation_key,
    generation_prefix,
    leave_round,
    move_generation,
    read_generation,
    refill_from_env,
)
from elastic.worker.rounds import Round


@pytest.fixture
def server():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))


def _client(server, prefix="run/round-3"):
    return dist.PrefixStore(prefix, dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False,
                                                  timeout=timedelta(seconds=10)))


@pytest.mark.parametrize("round_prefix, generation, prefix", [
    ("run/round-3", 0, "run/round-3"),  # the round as published keeps its own prefix
    ("run/round-3", 1, "run/round-3/gen-1"),
    ("run/round-3", 12, "run/round-3/gen-12"),
])
def test_generation_prefix(round_prefix, generation, prefix):
    assert generation_prefix(round_prefix, generation) == prefix


def test_movers_of_one_generation_agree_and_a_mover_from_an_old_one_joins_the_newest(server):
    store = _client(server)
    assert read_generation(store) == GenerationState(0, Move.PUBLISHED)
    assert move_generation(store, 0) == GenerationState(1, Move.REFILL)
    assert move_generation(_client(server), 0, Move.REGROUP).number == 1  # a second rank from generation 0: no further move
    assert move_generation(store, 1, Move.REGROUP) == GenerationState(2, Move.REGROUP)
    assert move_generation(_client(server), 0).number == 2  # a rank late from generation 0 joins the newest
    assert read_generation(_client(server)) == GenerationState(2, Move.REGROUP)
    assert read_generation(_client(server, "run/round-4")).number == 0  # another round has its own key


@pytest.mark.parametrize("raw", [b"-1", b"1", b"x1", b'{"v":1,"generation":-1,"move":"refill"}',
                                 b'{"v":2,"generation":1,"move":"refill"}', b'{"v":1,"generation":1,"move":"x"}',
                                 b'{"v":1,"generation":1,"move":"refill","left_for":"9"}', b"1" * 300, b"\xff"])
def test_a_generation_key_holding_garbage_is_refused_with_one_line(server, raw):
    store = _client(server)
    store.set(GENERATION_KEY, raw)
    with pytest.raises(ValueError, match="not a generation"):
        read_generation(store)
    with pytest.raises(ValueError, match="not a generation"):
        move_generation(store, 0)


def test_a_generation_that_is_not_in_the_store_is_refused(server):
    with pytest.raises(ValueError, match="its store was reset"):
        move_generation(_client(server), 3)  # a peer formed generation 3, and the store lost the key


def _formed(store, generation, members):
    store.set(generation_key(generation, VERDICT), encode_verdict(Verdict(members)))


def test_a_rank_leaving_for_a_newer_round_ends_its_generations_and_abandons_one_forming(server):
    store = _client(server)
    _formed(store, 0, (0, 1, 2))
    assert move_generation(store, 0) == GenerationState(1, Move.REFILL)  # a peer's group failed: generation 1 forms
    assert leave_round(store, 0, 1, 3, for_round=9) is True
    assert read_generation(store) == GenerationState(1, Move.REFILL, left_for=9)
    # Generation 1 can no longer form, and nobody moves past it: the peers wait for round 9.
    assert parse_verdict(store.get(generation_key(1, VERDICT)), 3) == Verdict(())
    assert move_generation(_client(server), 1).left_for == 9
    assert leave_round(_client(server), 0, 0, 3, for_round=9) is True  # a second leaver: nothing more to end


def test_a_rank_leaving_a_round_learns_that_it_trained_on_without_it(server):
    # Generation 1 formed without rank 2 (it was slow): the others may be training in it, so
    # rank 2 does not hold the newest state in the next round.
    store = _client(server)
    _formed(store, 0, (0, 1, 2))
    move_generation(store, 0)
    _formed(store, 1, (0, 1))
    assert leave_round(store, 0, 2, 3, for_round=9) is False
    assert leave_round(_client(server), 1, 0, 3, for_round=9) is True  # rank 0 formed generation 1


@pytest.mark.parametrize("value, replaces", [(None, False), ("", False), ("0", False), ("1", True)])
def test_refill_from_env(value, replaces):
    assert refill_from_env({} if value is None else {"ELASTIC_REFILL": value}) is replaces


def test_refill_from_env_refuses_anything_else():
    with pytest.raises(WorkerEnvError, match="ELASTIC_REFILL='yes' must be 0 or 1"):
        refill_from_env({"ELASTIC_REFILL": "yes"})


def test_a_barrier_waiting_for_a_rank_is_abandoned_when_the_generation_moves_past_it(server):
    # Rank 0 waits in generation 1 for rank 1, which was replaced: the replacement moves the key
    # to 2, and rank 0 leaves generation 1 for it instead of waiting out the form timeout.
    base = _client(server)
    assert move_generation(base, 0).number == 1
    round_ = Round(3, 0, 2, 0, 1, 0, "127.0.0.1", server.port, 0, "run/round-3")
    moved = _Moved(round_, base, GenerationState(1, Move.REFILL))
    outcome: dict = {}

    def wait() -> None:
        try:
            _barrier(_client(server, generation_prefix("run/round-3", 1)), round_, LiveOptions(), RoundMailbox(3),
                     time.monotonic() + 30, time.monotonic, moved)
            outcome["result"] = "go"
        except Exception as error:  # the test inspects it
            outcome["result"] = error

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.2)
    assert "result" not in outcome
    assert move_generation(_client(server), read_generation(base).number).number == 2  # the replacement's move
    thread.join(20)
    # It left because the key moved (_GenerationMoved, naming generation 2), not at its 30 s form
    # deadline, which would raise another error and only after the join above gave up. No bound on
    # how soon: that would measure the machine's load, not the barrier.
    assert not thread.is_alive()
    assert isinstance(outcome["result"], _GenerationMoved) and moved.newest.number == 2
