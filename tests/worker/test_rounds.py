"""The round line, the ready line and the worker environment (pure, no torch)."""

from __future__ import annotations

import json

import pytest

from elastic.worker.errors import ReadyLineError, RoundLineError, WorkerEnvError
from elastic.worker.rounds import (
    MAX_LINE_BYTES,
    MAX_READY_BYTES,
    Ready,
    ReadyEvent,
    Round,
    default_store_prefix,
    encode_ready_line,
    encode_round_line,
    export_round,
    parse_ready_line,
    parse_round_line,
    round_from_env,
)

ROUND = Round(round=7, rank=2, world_size=4, local_rank=0, local_world_size=1, group_rank=2,
              master_addr="10.0.0.1", master_port=29500, restart_count=1, store_prefix="etcd-elastic/live/job/round-7")


def _line(**changes) -> bytes:
    fields = {"v": 1, **{name: getattr(ROUND, name) for name in ROUND.__dataclass_fields__}, **changes}
    return json.dumps({k: v for k, v in fields.items() if v is not ...}).encode()


def test_a_line_round_trips():
    line = encode_round_line(ROUND)
    assert line.endswith(b"\n") and parse_round_line(line) == ROUND


def test_unknown_fields_are_ignored():
    assert parse_round_line(_line(node="n1", extra={"x": 1})) == ROUND


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"not json", "not UTF-8 JSON"),
        (b"\xff\xfe", "not UTF-8 JSON"),
        (b"[1, 2]", "JSON list, not an object"),
        (b"null", "JSON NoneType"),
        (_line(v=2), "version 2"),
        (_line(v=...), "version None"),
        (_line(rank=...), "lacks rank"),
        (_line(rank=4), "rank (4) must be in [0, world_size=4)"),
        (_line(rank=-1), "rank (-1)"),
        (_line(rank=True), "'rank' must be an integer"),
        (_line(rank="2"), "'rank' must be an integer"),
        (_line(world_size=0), "rank (2) must be in [0, world_size=0)"),
        (_line(local_rank=1), "local rank (1)"),
        (_line(master_port=0), "master port (0)"),
        (_line(master_port=70000), "master port (70000)"),
        (_line(master_addr=""), "'master_addr' must be a non-empty string"),
        (_line(store_prefix=None), "'store_prefix' must be a non-empty string"),
        (_line(store_prefix="p" * 2000), "at most 1024"),
        (_line(round=-1), "must not be negative"),
        (b"[" * 100_000, "over the 65536-byte limit"),
        (b"[" * 60_000, "not UTF-8 JSON"),  # deep nesting: a RecursionError, translated
    ],
)
def test_a_bad_line_is_one_clear_error(line, message):
    with pytest.raises(RoundLineError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        parse_round_line(line)


def test_an_encoded_line_respects_the_bound():
    assert len(encode_round_line(ROUND)) < MAX_LINE_BYTES


@pytest.mark.parametrize("event", list(ReadyEvent))
def test_a_ready_line_round_trips(event):
    ready = Ready(event, round=7, rank=2, step=120)
    line = encode_ready_line(ready)
    assert line.endswith(b"\n") and len(line) < MAX_READY_BYTES and parse_ready_line(line) == ready


def test_a_ready_line_as_workers_wrote_it_before_the_codec_is_read_and_extra_fields_are_ignored():
    old = b'{"v": 1, "event": "lost", "round": 3, "rank": 1, "step": 9}\n'
    assert parse_ready_line(old) == Ready(ReadyEvent.LOST, 3, 1, 9)
    assert parse_ready_line(b'{"v":1,"event":"formed","round":3,"rank":1,"step":9,"node":"n1"}').event is ReadyEvent.FORMED


def _ready(**changes) -> bytes:
    fields = {"v": 1, "event": "formed", "round": 4, "rank": 0, "step": 7, **changes}
    return json.dumps({k: v for k, v in fields.items() if v is not ...}).encode()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"garbage", "not UTF-8 JSON"),
        (b"[" * 2000, "not UTF-8 JSON"),  # deep nesting: a RecursionError, translated
        (b"[" * 5000, "over the 4096-byte limit"),
        (b'"formed"', "JSON str, not an object"),
        (_ready(v=2), "version 2; this agent reads version 1"),
        (_ready(v=...), "version None"),
        (_ready(event="healed"), "'healed' is none of joining, formed, lost"),
        (_ready(event=["formed"]), "none of"),
        (_ready(step=...), "lacks step"),
        (_ready(rank=...), "lacks rank"),
        (_ready(round="4"), "'round' must be a non-negative integer"),
        (_ready(step=True), "'step' must be a non-negative integer"),
        (_ready(round=-1), "'round' must be a non-negative integer"),
        (_ready(step=1.5), "'step' must be a non-negative integer"),
    ],
)
def test_a_bad_ready_line_is_one_clear_error(line, message):
    with pytest.raises(ReadyLineError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        parse_ready_line(line)


def test_a_ready_value_refuses_an_event_that_is_not_a_ready_event():
    with pytest.raises(ValueError, match="must be a ReadyEvent"):
        Ready("formed", 1, 0, 0)


ENV = {"RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "h", "MASTER_PORT": "29400", "LOCAL_RANK": "0",
       "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "1", "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_RUN_ID": "job"}


def test_the_first_round_comes_from_the_environment():
    env = {**ENV, "ELASTIC_ROUND_FD": "5", "ELASTIC_ROUND": "4", "ELASTIC_STORE_PREFIX": "p/4"}
    assert round_from_env(env) == Round(4, 1, 3, 0, 1, 1, "h", 29400, 2, "p/4")


def test_without_a_round_pipe_the_round_is_the_restart_count():
    got = round_from_env(ENV)
    assert (got.round, got.store_prefix) == (2, default_store_prefix("job", 2))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"RANK": None}, "lacks RANK"),
        ({"MASTER_ADDR": None}, "lacks MASTER_ADDR"),
        ({"WORLD_SIZE": "x"}, "WORLD_SIZE='x' is not an integer"),
        ({"RANK": "3"}, "rank \\(3\\) must be in"),
        ({"ELASTIC_ROUND_FD": "5"}, "lacks ELASTIC_ROUND"),
        ({"ELASTIC_ROUND_FD": "5", "ELASTIC_ROUND": "1"}, "ELASTIC_STORE_PREFIX is not"),
    ],
)
def test_a_bad_environment_is_one_clear_error(changes, message):
    env = {k: v for k, v in {**ENV, **changes}.items() if v is not None}
    with pytest.raises(WorkerEnvError, match=message):
        round_from_env(env)


def test_exporting_a_round_updates_torchruns_variables():
    env = dict(ENV)
    export_round(ROUND, env)
    assert round_from_env({**env, "ELASTIC_ROUND_FD": "5"}) == ROUND
