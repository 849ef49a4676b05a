"""The barrier that decides whether a round forms, on a real c10d TCPStore (no process group)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from elastic.worker.channel import RoundMailbox
from elastic.worker.errors import CollectiveFailed, NoRoundError, Superseded
from elastic.worker.group import GO, VERDICT, _barrier
from elastic.worker.options import LiveOptions
from elastic.worker.rounds import Round


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    yield lambda: dist.PrefixStore("round-1", dist.TCPStore("127.0.0.1", server.port, is_master=False,
                                                              wait_for_workers=False, timeout=timedelta(seconds=10)))


def _round(rank: int, world: int = 2, number: int = 1) -> Round:
    return Round(number, rank, world, 0, 1, rank, "127.0.0.1", 1, 0, "round-1")


def _run(store, rank, mailbox, options=LiveOptions(), world=2):
    outcome: dict = {}

    def target():
        try:
            _barrier(store(), _round(rank, world), options, mailbox, time.monotonic() + options.form_timeout, time.monotonic)
            outcome["result"] = "go"
        except Exception as error:  # the test inspects it
            outcome["result"] = error

    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome


def test_every_rank_goes_once_all_arrived(store):
    runs = [_run(store, rank, RoundMailbox(1), world=3) for rank in range(3)]
    for thread, _ in runs:
        thread.join(10)
    assert [outcome["result"] for _, outcome in runs] == ["go"] * 3


def test_a_rank_that_sees_a_newer_round_first_abandons_the_round_for_everyone(store):
    waiting = RoundMailbox(1)
    first, first_out = _run(store, 0, waiting)
    waiting.offer(_round(0, number=2), 0.0)  # a newer round reaches rank 0 before rank 1 arrives
    first.join(10)
    assert isinstance(first_out["result"], Superseded)
    late, late_out = _run(store, 1, RoundMailbox(1))  # rank 1 has not seen the newer round yet
    late.join(10)
    assert isinstance(late_out["result"], Superseded)


def test_once_the_round_went_a_newer_round_does_not_pull_a_rank_out(store):
    prefixed = store()
    prefixed.add("elastic-live/arrived", 2)
    assert prefixed.compare_set(VERDICT, "", GO) == GO
    mailbox = RoundMailbox(1)
    mailbox.offer(_round(0, number=2), 0.0)
    thread, outcome = _run(store, 0, mailbox, world=3)
    thread.join(10)
    assert outcome["result"] == "go"


def test_a_round_whose_ranks_do_not_all_arrive_fails_at_the_form_timeout(store):
    thread, outcome = _run(store, 0, RoundMailbox(1), LiveOptions(form_timeout=0.3))
    thread.join(10)
    assert isinstance(outcome["result"], NoRoundError)
    assert "1 of 2 ranks arrived" in str(outcome["result"])


def test_a_store_that_goes_away_is_a_lost_group():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    client = dist.PrefixStore("r", dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False,
                                                 timeout=timedelta(seconds=2)))
    del server
    with pytest.raises(CollectiveFailed, match="its store failed during the barrier"):
        _barrier(client, _round(0), LiveOptions(), RoundMailbox(1), time.monotonic() + 5, time.monotonic)
