"""The worker environment, names, options and init method: pure functions, case tables."""

from __future__ import annotations

import pytest

from rpc.env import RpcOptions, RpcWorkerEnv, parse_worker_name, worker_name
from rpc.errors import RpcInitError, RpcOptionsError, RpcSetupError, WorkerEnvError
from rpc.rendezvous import init_method, parse_init_method, store_prefix

BASE = {"RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def env_of(**changes: str | None) -> dict[str, str]:
    environ = dict(BASE)
    for key, value in changes.items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    return environ


# -- parsing -----------------------------------------------------------------------------------


def test_a_plain_environment_gives_role_worker_and_the_global_rank_as_role_rank():
    env = RpcWorkerEnv.from_environ(BASE)
    assert (env.rank, env.world_size, env.role, env.role_rank, env.role_world_size) == (1, 3, "worker", 1, 3)
    assert (env.master_addr, env.master_port, env.restart_count, env.run_id) == ("10.0.0.1", 29500, 0, "none")
    assert env.name == "worker1" and env.use_agent_store is False


def test_elasticruns_environment_is_parsed_with_its_role_and_restart_count():
    environ = env_of(ROLE_NAME="trainer", ROLE_RANK="1", ROLE_WORLD_SIZE="2", LOCAL_RANK="1",
                     TORCHELASTIC_RESTART_COUNT="3", TORCHELASTIC_RUN_ID="job-7", TORCHELASTIC_USE_AGENT_STORE="True")
    env = RpcWorkerEnv.from_environ(environ)
    assert (env.role, env.role_rank, env.role_world_size, env.local_rank) == ("trainer", 1, 2, 1)
    assert (env.restart_count, env.run_id, env.use_agent_store) == (3, "job-7", True)
    assert env.name == "trainer1"


def test_every_missing_variable_is_named_in_one_sentence():
    with pytest.raises(WorkerEnvError) as raised:
        RpcWorkerEnv.from_environ({"RANK": "0", "MASTER_ADDR": " "})
    message = str(raised.value)
    assert "missing WORLD_SIZE, MASTER_ADDR, MASTER_PORT" in message
    assert "elasticrun" in message
    assert isinstance(raised.value, RpcSetupError) and isinstance(raised.value, ValueError)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"RANK": "3"}, "RANK (3) must be less than WORLD_SIZE (3)."),
        ({"RANK": "-1"}, "RANK ('-1') must be a non-negative integer."),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE ('two') must be a non-negative integer."),
        ({"WORLD_SIZE": "0", "RANK": "0"}, "WORLD_SIZE (0) must be from 1 to 65536"),
        ({"WORLD_SIZE": "65537"}, "WORLD_SIZE (65537) must be from 1 to 65536"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT (70000) must be from 1 to 65535."),
        ({"MASTER_PORT": "0"}, "MASTER_PORT (0) must be from 1 to 65535."),
        ({"ROLE_RANK": "0"}, "ROLE_RANK is set but ROLE_WORLD_SIZE is not: set both or neither."),
        ({"ROLE_WORLD_SIZE": "2"}, "ROLE_WORLD_SIZE is set but ROLE_RANK is not: set both or neither."),
        ({"ROLE_RANK": "2", "ROLE_WORLD_SIZE": "2"}, "ROLE_RANK (2) must be less than ROLE_WORLD_SIZE (2)."),
        ({"ROLE_RANK": "0", "ROLE_WORLD_SIZE": "4"}, "ROLE_WORLD_SIZE (4) must be from 1 to WORLD_SIZE (3)."),
        ({"ROLE_NAME": "stage2"}, "must not end with a digit"),
        ({"ROLE_NAME": "my role"}, "use only letters, digits"),
        ({"ROLE_NAME": "r" * 127}, "longer than torch's 127 characters"),
        ({"TORCHELASTIC_RESTART_COUNT": "x"}, "TORCHELASTIC_RESTART_COUNT ('x') must be a non-negative integer."),
        ({"LOCAL_RANK": "1.5"}, "LOCAL_RANK ('1.5') must be a non-negative integer."),
    ],
)
def test_inconsistent_environments_are_refused_with_a_sentence(changes, message):
    with pytest.raises(WorkerEnvError) as raised:
        RpcWorkerEnv.from_environ(env_of(**changes))
    assert message in str(raised.value)


# -- names -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "role, rank, name",
    [("worker", 1, "worker1"), ("ps", 0, "ps0"), ("trainer", 12, "trainer12"), ("stage-a", 3, "stage-a3"),
     ("gen:policy_", 7, "gen:policy_7")],
)
def test_names_are_role_then_role_rank_and_split_back(role, rank, name):
    assert worker_name(role, rank) == name
    assert parse_worker_name(name) == (role, rank)


@pytest.mark.parametrize("name", ["worker", "7", "worker007", "worker-1x", ""])
def test_names_not_made_by_worker_name_do_not_parse(name):
    assert parse_worker_name(name) is None


def test_a_negative_role_rank_has_no_name():
    with pytest.raises(WorkerEnvError, match="must not be negative"):
        worker_name("worker", -1)


# -- options -----------------------------------------------------------------------------------


def test_options_come_from_arguments_then_environment_then_defaults():
    environ = {"ELASTIC_RPC_TIMEOUT": "12.5", "ELASTIC_RPC_NUM_THREADS": "4", "ELASTIC_RPC_SIGTERM_TIMEOUT": "2",
               "ELASTIC_RPC_TRANSPORTS": "shm, uv"}
    options = RpcOptions.resolve(environ, num_worker_threads=8, init_timeout=None)
    assert options == RpcOptions(rpc_timeout=12.5, init_timeout=120.0, num_worker_threads=8,
                                 shutdown_timeout=0.0, sigterm_timeout=2.0, transports=("shm", "uv"))
    assert RpcOptions.resolve({}) == RpcOptions()
    assert RpcOptions().transports == ("uv",)  # shm busy-polls a core per idle worker (torch 2.13)


@pytest.mark.parametrize("given, expected", [("auto", None), ("uv", ("uv",)), (["ibv", "uv"], ("ibv", "uv"))])
def test_transports_are_a_list_or_auto_for_torchs_choice(given, expected):
    assert RpcOptions.resolve({}, transports=given).transports == expected
    assert RpcOptions.resolve({"ELASTIC_RPC_TRANSPORTS": ",".join(given) if isinstance(given, list) else given}
                              ).transports == expected


@pytest.mark.parametrize(
    "environ, overrides, message",
    [
        ({"ELASTIC_RPC_TIMEOUT": "soon"}, {}, "ELASTIC_RPC_TIMEOUT ('soon') must be a number of seconds."),
        ({"ELASTIC_RPC_NUM_THREADS": "2.5"}, {}, "ELASTIC_RPC_NUM_THREADS ('2.5') must be an integer."),
        ({}, {"rpc_timeout": 0}, "The rpc timeout (0) must be a positive number of seconds."),
        ({}, {"init_timeout": float("inf")}, "The init timeout (inf) must be a positive number of seconds."),
        ({}, {"num_worker_threads": 0}, "The number of worker threads (0) must be at least 1."),
        ({}, {"shutdown_timeout": -1}, "The shutdown timeout (-1) must be 0 (no limit) or a positive number"),
        ({}, {"rpc_timout": 3}, "Unknown RPC option(s) rpc_timout"),
        ({"ELASTIC_RPC_TRANSPORTS": "tcp"}, {}, "The transports (tcp) must be one or more of uv, shm, ibv, or auto."),
        ({}, {"transports": ","}, "The transports (none) must be one or more of"),
    ],
)
def test_invalid_options_are_refused_with_a_sentence(environ, overrides, message):
    with pytest.raises(RpcOptionsError) as raised:
        RpcOptions.resolve(environ, **overrides)
    assert message in str(raised.value)


# -- the init method of an attempt -------------------------------------------------------------


def test_the_init_method_names_the_attempts_store_and_round_trips():
    env = RpcWorkerEnv.from_environ(env_of(TORCHELASTIC_RUN_ID="job-7", TORCHELASTIC_RESTART_COUNT="2"))
    url = init_method(env, 45)
    assert url.startswith("elastic-rpc://10.0.0.1:29500/")
    spec, rank, world = parse_init_method(url + "&rank=1&world_size=3")  # torch appends these
    assert (spec.host, spec.port, spec.timeout, spec.agent_store, rank, world) == ("10.0.0.1", 29500, 45.0, False, 1, 3)
    assert spec.prefix == store_prefix(env) == "etcd-elastic/rpc/job-7/restart-2"


def test_each_attempt_gets_another_store_and_prefix():
    first = RpcWorkerEnv.from_environ(env_of(TORCHELASTIC_RESTART_COUNT="0", MASTER_PORT="29500"))
    restarted = RpcWorkerEnv.from_environ(env_of(TORCHELASTIC_RESTART_COUNT="1", MASTER_PORT="41234"))
    same_port = RpcWorkerEnv.from_environ(env_of(TORCHELASTIC_RESTART_COUNT="1", MASTER_PORT="29500"))
    urls = {init_method(env, 60) for env in (first, restarted, same_port)}
    assert len(urls) == 3
    assert store_prefix(first) != store_prefix(same_port)  # a store shared across attempts: other keys


def test_an_ipv6_master_is_bracketed_and_parsed_back():
    env = RpcWorkerEnv.from_environ(env_of(MASTER_ADDR="fd00::7"))
    spec, _, _ = parse_init_method(init_method(env, 10) + "&rank=1&world_size=3")
    assert spec.host == "fd00::7"


@pytest.mark.parametrize(
    "url",
    ["tcp://h:1/p?timeout=1&rank=0&world_size=1", "elastic-rpc://h/p?timeout=1&rank=0&world_size=1",
     "elastic-rpc://h:1/p?rank=0&world_size=1", "elastic-rpc://h:1/p?timeout=1&world_size=1",
     "elastic-rpc://h:1/?timeout=1&rank=0&world_size=1"],
)
def test_incomplete_init_methods_are_refused(url):
    with pytest.raises(RpcInitError, match="elastic-rpc|store prefix"):
        parse_init_method(url)
