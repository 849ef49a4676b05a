"""The barrier that decides whether, and with whom, a generation of a round forms, on a real c10d
TCPStore (no process group)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from elastic.worker.channel import RoundMailbox
from elastic.worker.errors import CollectiveFailed, NoRoundError, Superseded
from elastic.worker.formation import ARRIVALS, VERDICT, ArrivalRecord, Verdict, encode_verdict
from elastic.worker.group import _barrier, _LeftOut
from elastic.worker.options import LiveOptions
from elastic.worker.rounds import Round


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    yield lambda: dist.PrefixStore("round-1", dist.TCPStore("127.0.0.1", server.port, is_master=False,
                                                              wait_for_workers=False, timeout=timedelta(seconds=10)))


def _round(rank: int, world: int = 2, number: int = 1) -> Round:
    return Round(number, rank, world, 0, 1, rank, "127.0.0.1", 1, 0, "round-1")


def _run(store, rank, mailbox, options=LiveOptions(), world=2, holder=False, expected=None):
    outcome: dict = {}

    def target():
        try:
            outcome["result"] = _barrier(store(), _round(rank, world), options, mailbox,
                                         time.monotonic() + options.form_timeout, time.monotonic,
                                         arrival=ArrivalRecord(rank, holder, 25, 1), expected=expected)
        except Exception as error:  # the test inspects it
            outcome["result"] = error

    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome


def test_every_rank_goes_with_every_rank_once_all_arrived(store):
    runs = [_run(store, rank, RoundMailbox(1), world=3) for rank in range(3)]
    for thread, _ in runs:
        thread.join(10)
    assert [outcome["result"] for _, outcome in runs] == [(0, 1, 2)] * 3


def test_a_rank_that_sees_a_newer_round_first_abandons_the_round_for_everyone(store):
    waiting = RoundMailbox(1)
    first, first_out = _run(store, 0, waiting)
    waiting.offer(_round(0, number=2), 0.0)  # a newer round reaches rank 0 before rank 1 arrives
    first.join(10)
    assert isinstance(first_out["result"], Superseded)
    late, late_out = _run(store, 1, RoundMailbox(1))  # rank 1 has not seen the newer round yet
    late.join(10)
    assert isinstance(late_out["result"], Superseded)


def test_once_the_round_went_a_newer_round_does_not_pull_a_member_out(store):
    prefixed = store()
    assert prefixed.compare_set(VERDICT, "", encode_verdict(Verdict((0, 1, 2))).decode())
    mailbox = RoundMailbox(1)
    mailbox.offer(_round(0, number=2), 0.0)
    thread, outcome = _run(store, 0, mailbox, world=3)
    thread.join(10)
    assert outcome["result"] == (0, 1, 2)


def test_ranks_that_hold_no_state_wait_for_every_rank_up_to_the_form_timeout(store):
    # A job's first formation: everyone is fresh, so nobody may go on without the others.
    thread, outcome = _run(store, 0, RoundMailbox(1), LiveOptions(form_timeout=0.5, regroup_window=0.01))
    thread.join(10)
    assert isinstance(outcome["result"], NoRoundError)
    assert "1 of 2 ranks arrived, none of them holding training state" in str(outcome["result"])


def test_a_rank_holding_the_state_closes_without_a_missing_rank_once_the_window_passed(store):
    # The survivor of a crash: the replacement is still starting (a fresh process, CUDA's
    # initialisation); the survivor forms a group of one and trains on.
    survivors = [_run(store, rank, RoundMailbox(1), LiveOptions(regroup_window=0.05), world=3, holder=True)
                 for rank in (0, 2)]
    for thread, _ in survivors:
        thread.join(10)
    assert [outcome["result"] for _, outcome in survivors] == [(0, 2), (0, 2)]
    # The replacement arrives later: the generation formed without it.
    late, late_out = _run(store, 1, RoundMailbox(1), world=3)
    late.join(10)
    assert isinstance(late_out["result"], _LeftOut) and late_out["result"].members == (0, 2)


def test_a_fresh_rank_alone_does_not_open_the_window(store):
    # The joiner of a regroup arrives first and waits for the state holders; it never closes alone.
    joiner, joined = _run(store, 1, RoundMailbox(1), LiveOptions(regroup_window=0.01), world=3)
    time.sleep(0.3)
    assert "result" not in joined
    holder, held = _run(store, 0, RoundMailbox(1), LiveOptions(regroup_window=0.01), world=3, holder=True)
    for thread in (joiner, holder):
        thread.join(10)
    assert joined["result"] == held["result"] == (0, 1)


def test_a_regroup_waits_for_every_member_it_replaces_and_not_for_the_window(store):
    # Generation g formed with ranks 0 and 2; rank 1 arrived late and opened g+1, a regroup. The
    # members come at their step boundary, possibly a whole step apart: none is cut off by the
    # window, and rank 3, still starting, is not waited for.
    expected = frozenset({0, 2})
    options = LiveOptions(regroup_window=0.01)
    joiner, joined = _run(store, 1, RoundMailbox(1), options, world=4, expected=expected)
    first, first_out = _run(store, 0, RoundMailbox(1), options, world=4, holder=True, expected=expected)
    time.sleep(0.3)
    assert "result" not in joined and "result" not in first_out
    second, second_out = _run(store, 2, RoundMailbox(1), options, world=4, holder=True, expected=expected)
    for thread in (joiner, first, second):
        thread.join(10)
    assert joined["result"] == first_out["result"] == second_out["result"] == (0, 1, 2)


@pytest.mark.parametrize("raw", [b"go", b'{"v":1,"verdict":"go","members":[1,0]}',
                                 b'{"v":1,"verdict":"go","members":[0,7]}', b'{"v":2,"verdict":"abandon"}',
                                 b'{"v":1,"verdict":"go","members":[]}', b"\xff" * 2000])
def test_a_malformed_verdict_is_one_lost_group_line(store, raw):
    store().set(VERDICT, raw)
    thread, outcome = _run(store, 0, RoundMailbox(1))
    thread.join(10)
    error = outcome["result"]
    assert isinstance(error, CollectiveFailed) and "verdict" in str(error) and "\n" not in str(error)


@pytest.mark.parametrize("line", [b'{"v":1,"rank":9,"holder":true,"step":0,"round":1}\n', b"garbage\n",
                                  b'{"v":1,"rank":1,"holder":"yes","step":0,"round":1}\n'])
def test_a_malformed_arrival_is_one_lost_group_line(store, line):
    peer = store()
    peer.append(ARRIVALS, line)
    peer.add("elastic-live/arrived", 1)
    thread, outcome = _run(store, 0, RoundMailbox(1))
    thread.join(10)
    error = outcome["result"]
    assert isinstance(error, CollectiveFailed) and "arrival" in str(error) and "\n" not in str(error)


def test_a_store_that_goes_away_is_a_lost_group():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    client = dist.PrefixStore("r", dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False,
                                                 timeout=timedelta(seconds=2)))
    del server
    with pytest.raises(CollectiveFailed, match="its store failed during the barrier"):
        _barrier(client, _round(0), LiveOptions(), RoundMailbox(1), time.monotonic() + 5, time.monotonic)
