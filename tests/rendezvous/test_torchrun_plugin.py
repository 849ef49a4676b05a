"""Stock torchrun with ``--rdzv-backend=etcd-v3``: our engine through torch's entry-point group.

The slow tests start real ``torchrun`` processes whose gloo workers all-reduce over loopback,
against the session's real etcd (auth on; credentials go through ``--rdzv-conf``). Each test
has its own run id; every process is stopped by its PID in a ``finally``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from datetime import timedelta
from importlib.metadata import entry_points
from pathlib import Path

import pytest

# torch is installed by .ci/run (pip install torch==2.13.0); without it these tests fail, not skip.
import torch.distributed as dist  # noqa: E402
import torch.distributed.elastic.rendezvous.api as torch_api  # noqa: E402

from backends.endpoints import Endpoint  # noqa: E402
from elastic.rendezvous import errors as ours  # noqa: E402
from elastic.rendezvous.backend_spec import (  # noqa: E402
    ClientCertificate, EtcdCredentials, EtcdSpec, Secret, Timeouts,
)
from elastic.rendezvous.api import MembershipChange, MembershipStatus, Rendezvous  # noqa: E402
from elastic.rendezvous.api import RendezvousInfo  # noqa: E402
from elastic.rendezvous.records import Member  # noqa: E402
from elastic.rendezvous.torchrun_plugin import (  # noqa: E402
    BACKEND_NAME,
    REJOIN_GRACE_S,
    TorchrunRendezvousHandler,
    backend_from_params,
    conf_from_params,
    create_rdzv_handler,
    handler_creator,
    our_conf,
    settings_from_params,
    to_torch_error,
)
from elastic.testing import with_stacks  # noqa: E402
from elastic.testing.agents import Launched, wait_while_running  # noqa: E402

pytestmark = pytest.mark.needs_torch

TORCHRUN_TIMEOUT = 120.0
"""Seconds one torchrun may take in all (rendezvous, two gloo workers, exit barrier)."""

WORKER_SCRIPT = '''
import json, os, sys, time
import torch
import torch.distributed as dist

out_dir, hold_world = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0
dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
report = {
    "rank": dist.get_rank(),
    "world_size": dist.get_world_size(),
    "env_rank": int(os.environ["RANK"]),
    "env_world_size": int(os.environ["WORLD_SIZE"]),
    "group_rank": int(os.environ["GROUP_RANK"]),
    "restart_count": int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
    "master": [os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])],
    "use_agent_store": os.environ["TORCHELASTIC_USE_AGENT_STORE"],
    "agent_pid": os.getppid(),
    "sum": value.item(),
}
with open(os.path.join(out_dir, "w%d-rank%d.json" % (report["world_size"], report["rank"])), "w") as out:
    json.dump(report, out)
if report["world_size"] == hold_world:
    time.sleep(120)  # keep this world running until the test changes its membership
dist.destroy_process_group()
'''


# -- helpers ----------------------------------------------------------------------------------
def torchrun_command(console_script: bool = False) -> list[str]:
    """torch's launcher as this interpreter runs it: the ``torchrun`` console script (it calls
    ``torch.distributed.run.main``) when asked and installed, else ``torch.distributed.run``
    under :mod:`elastic.testing.with_stacks`, so that a hung agent's threads can be dumped."""
    script = Path(sys.executable).with_name("torchrun")
    if console_script and script.exists():
        return [str(script)]
    return with_stacks.command("torch.distributed.run")


def etcd_endpoint(etcd_server) -> str:
    """``host:port`` of the session's etcd, as a torchrun user would write it."""
    return etcd_server.endpoints.split(",")[0].split("://", 1)[-1]


def etcd_credentials(etcd_server) -> str:
    config = etcd_server.client_config()
    return f"user={config.user},password={config.password}"


def unique_run_id(label: str) -> str:
    return f"torchrun-{label}-{uuid.uuid4().hex[:8]}"


def start_torchrun(tmp_path: Path, etcd_server, run_id: str, nnodes: str, name: str, *,
                   extra_conf: str = "", hold_world: int = 0, share_store: bool = True,
                   console_script: bool = False) -> Launched:
    """One torchrun agent with 2 gloo workers; its log goes to ``tmp_path/<name>.log``.

    Workers in a world of ``hold_world`` processes report, then sleep instead of exiting.
    ``share_store=False`` sets torch's opt-out TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1.
    ``console_script``: start the installed ``torchrun`` command (see :func:`torchrun_command`).
    """
    script = tmp_path / "worker.py"
    script.write_text(WORKER_SCRIPT)
    out_dir = tmp_path / "out"
    out_dir.mkdir(exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "LOGLEVEL": "INFO",
           "PYTHONUNBUFFERED": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0" if share_store else "1"}
    command = [
        *torchrun_command(console_script),
        f"--rdzv-backend={BACKEND_NAME}",
        f"--rdzv-endpoint={etcd_endpoint(etcd_server)}",
        f"--rdzv-id={run_id}",
        f"--rdzv-conf={etcd_credentials(etcd_server)},join_timeout=60,read_timeout=60{extra_conf}",
        f"--nnodes={nnodes}",
        "--nproc-per-node=2",
        "--max-restarts=0",
        "--monitor-interval=0.2",
        str(script),
        str(out_dir),
        str(hold_world),
    ]
    return Launched(command, name=name, logdir=tmp_path, env=env, cwd=tmp_path, merge_output=True,
                    new_session=True, timeout=TORCHRUN_TIMEOUT)


def stop_by_pid(process: Launched, *, hard: bool = False) -> None:
    """Stop torchrun (SIGTERM, or SIGKILL when ``hard``) and then any worker it left, each by its PID."""
    if hard:
        process.kill_tree()
    else:
        process.stop(grace=15)


def wait_all(processes: list[Launched], tmp_path: Path) -> float:
    """Wait for every torchrun to exit 0 within :data:`TORCHRUN_TIMEOUT`; the seconds it took.

    One that does not exit fails the test with where it waits (its OS threads and native stacks,
    then, on SIGUSR1, every Python thread's stack in its log: with_stacks) and the logs."""
    started = time.monotonic()
    for index, process in enumerate(processes):
        code = process.exited_within(max(TORCHRUN_TIMEOUT - (time.monotonic() - started), 0.1))
        if code is None:
            pytest.fail(f"torchrun {index} did not finish in {TORCHRUN_TIMEOUT:g}s:\n{process.hang}\n{logs(tmp_path)}")
        assert code == 0, f"torchrun {index} exited {code}:\n{logs(tmp_path)}"
    return time.monotonic() - started


def logs(tmp_path: Path) -> str:
    return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-6000:]}"
                     for path in sorted(tmp_path.glob("*.log")))


def worker_reports(tmp_path: Path, world_size: int) -> list[dict]:
    """What the workers of worlds of ``world_size`` processes wrote."""
    return [json.loads(path.read_text()) for path in sorted((tmp_path / "out").glob(f"w{world_size}-rank*.json"))]


def wait_for_reports(tmp_path: Path, world_size: int, processes: list[Launched]) -> list[dict]:
    """Poll until all ``world_size`` workers of a world reported (bounded by :data:`TORCHRUN_TIMEOUT`);
    fails when a torchrun exits first."""
    def complete() -> list[dict]:
        reports = worker_reports(tmp_path, world_size)
        return reports if len(reports) == world_size else []

    return wait_while_running(f"a world of {world_size} workers", complete, processes, TORCHRUN_TIMEOUT,
                              interval=0.2, context=lambda: logs(tmp_path))


# -- translation (no torch processes) ---------------------------------------------------------
def test_torch_option_names_become_ours():
    params = torch_api.RendezvousParameters(
        BACKEND_NAME, "127.0.0.1:2379", "job", 1, 2, timeout=900, rank=3, ca_cert="/ca.pem",
        ssl_cert="/c.pem", ssl_cert_key="/k.pem", last_call_timeout="5", user="root",
    )
    assert conf_from_params(params) == {
        "join_timeout": "900", "cacert": "/ca.pem", "cert": "/c.pem", "key": "/k.pem",
        "last_call_timeout": "5", "user": "root",
    }


def test_an_explicit_join_timeout_wins_over_torchruns_rdzv_timeout():
    params = torch_api.RendezvousParameters(BACKEND_NAME, "127.0.0.1:2379", "job", 1, 1, timeout=900, join_timeout=30)
    assert conf_from_params(params)["join_timeout"] == "30"


def test_torchs_parameters_become_the_same_typed_spec_as_elasticruns_flags():
    params = torch_api.RendezvousParameters(
        BACKEND_NAME, "e0:1,e1", "job", 1, 2, ca_cert="/ca.pem", ssl_cert="/c.pem", ssl_cert_key="/k.pem",
        user="root", password="hunter2", protocol="https", read_timeout=30, dial_timeout="2",
    )
    spec = backend_from_params(params)
    assert spec == EtcdSpec(
        BACKEND_NAME, (Endpoint("e0", 1, "https"), Endpoint("e1", 2379, "https")), ca_cert="/ca.pem",
        client_certificate=ClientCertificate("/c.pem", "/k.pem"),
        credentials=EtcdCredentials("root", Secret("password", "hunter2")), timeouts=Timeouts(dial=2, request=30))
    assert "hunter2" not in repr(spec)


@pytest.mark.parametrize("config, expected", [
    ({}, 60.0), ({"request_timeout": "9"}, 60.0), ({"read_timeout": "30"}, 30.0),
    ({"read_timeout": "30", "request_timeout": "9"}, 30.0),
])
def test_the_agent_stores_timeout_is_read_timeout_or_torchs_default(config, expected):
    from elastic.rendezvous.torchrun_plugin import _store_timeout

    params = torch_api.RendezvousParameters(BACKEND_NAME, "e:1", "job", 1, 1, **config)
    assert _store_timeout(params, backend_from_params(params)) == expected


@pytest.mark.parametrize("endpoint, config, says", [
    ("", {}, "needs --rdzv-endpoint"),
    ("e:99999", {}, "has port '99999'"),
    ("e:1", {"user": "root"}, "without a password"),
    ("e:1", {"read_timeout": "-1"}, "read_timeout='-1' must be a positive number"),
])
def test_bad_torch_parameters_are_value_errors_before_connecting(endpoint, config, says):
    params = torch_api.RendezvousParameters(BACKEND_NAME, endpoint, "job", 1, 1, **config)
    with pytest.raises(ValueError, match=says):
        create_rdzv_handler(params)


@pytest.mark.parametrize("error, expected", [
    (ours.RendezvousClosedError("closed"), torch_api.RendezvousClosedError),
    (ours.RendezvousTimeoutError("late"), torch_api.RendezvousTimeoutError),
    (ours.RendezvousConnectionError("down"), torch_api.RendezvousConnectionError),
    (ours.RendezvousSessionLostError("lease"), torch_api.RendezvousConnectionError),
    (ours.RendezvousStateError("corrupt"), torch_api.RendezvousStateError),
    (ours.RendezvousError("other"), torch_api.RendezvousError),
    (ours.RendezvousConfigError("bad option"), ValueError),
])
def test_our_errors_become_torchs_with_the_same_message(error, expected):
    translated = to_torch_error(error)
    assert type(translated) is expected
    assert str(translated) == str(error)


def test_an_unknown_option_is_refused_before_connecting():
    params = torch_api.RendezvousParameters(BACKEND_NAME, "127.0.0.1:1", "job", 1, 1, no_such_option="1")
    with pytest.raises(ValueError, match="no_such_option"):
        create_rdzv_handler(params)


class StubHandler(Rendezvous):
    """A rendezvous with fixed answers: just what the adapter reads of ours."""

    def __init__(self, waiting: int = 0, change: MembershipChange | None = None, rank: int = 0) -> None:
        self.waiting, self.change, self.rank = waiting, change, rank

    run_id = "job"
    node_id = "node-a"
    rejoining = 0

    def membership(self) -> MembershipStatus:
        return MembershipStatus(self.change, "why" if self.change else "", self.waiting, self.rejoining)

    def next_rendezvous(self) -> RendezvousInfo:
        members = (Member("node-a", "127.0.0.1", 1), Member("node-b", "127.0.0.1", 2))
        return RendezvousInfo("job", 3, self.rank, 2, "127.0.0.1", 1, members)

    def shutdown(self) -> None:
        pass


@pytest.mark.parametrize("waiting, change, expected", [
    (0, None, 0),
    (2, MembershipChange.NODES_WAITING, 2),
    (0, MembershipChange.NODES_WAITING, 0),  # e.g. beyond max_nodes: a spare, no restart
    (0, MembershipChange.MEMBER_LOST, 1),
    (0, MembershipChange.ROUND_SUPERSEDED, 1),
    (0, MembershipChange.CLOSED, 1),
])
def test_a_lost_member_is_reported_to_torch_as_a_waiting_node_so_survivors_restart(waiting, change, expected):
    adapter = TorchrunRendezvousHandler(StubHandler(waiting, change), "127.0.0.1")
    assert adapter.num_nodes_waiting() == expected


def test_the_reason_for_a_restart_torch_calls_new_nodes_is_a_warning_once_so_torchrun_prints_it(caplog):
    adapter = TorchrunRendezvousHandler(StubHandler(0, MembershipChange.MEMBER_LOST), "127.0.0.1")
    with caplog.at_level("INFO", logger="elastic.rendezvous.torchrun_plugin"):
        assert [adapter.num_nodes_waiting() for _ in range(3)] == [1, 1, 1]
    said = [record for record in caplog.records if "asks torchrun to restart its workers: why" in record.getMessage()]
    assert [record.levelname for record in said] == ["WARNING"]  # torchrun shows no INFO of ours


def test_a_member_that_rejoined_is_hidden_from_torch_for_the_grace_so_our_own_failure_counts_first():
    stub = StubHandler(waiting=1, change=MembershipChange.NODES_WAITING)
    stub.rejoining = 1
    adapter = TorchrunRendezvousHandler(stub, "127.0.0.1")
    now = [100.0]
    adapter._clock = lambda: now[0]
    assert adapter.num_nodes_waiting() == 0  # our workers are about to fail on the collective it broke
    now[0] += REJOIN_GRACE_S - 0.1
    assert adapter.num_nodes_waiting() == 0
    now[0] += 0.2
    assert adapter.num_nodes_waiting() == 1  # they did not: restart for the rejoin anyway
    stub.rejoining = 0  # a newcomer (scale-up) is reported at once
    fresh = TorchrunRendezvousHandler(stub, "127.0.0.1")
    assert fresh.num_nodes_waiting() == 1


@pytest.mark.parametrize("rank, verb", [(0, "host"), (1, "reach")])
def test_an_agent_store_that_cannot_be_opened_is_a_rendezvous_connection_error(rank, verb):
    def refuse(host, port, is_master, timeout, listen_fd=None):
        assert (host, port, is_master) == ("127.0.0.1", 1, rank == 0)
        raise RuntimeError("address in use")

    adapter = TorchrunRendezvousHandler(StubHandler(rank=rank), "127.0.0.1", store_factory=refuse)
    with pytest.raises(torch_api.RendezvousConnectionError, match=f"cannot {verb} the agent store") as raised:
        adapter.next_rendezvous()
    assert isinstance(raised.value.__cause__, RuntimeError)


# -- with a real etcd -------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.etcd
def test_the_entry_point_is_discoverable_and_torchs_registry_creates_our_adapter(etcd_server):
    discovered = {point.name: point for point in entry_points(group="torchrun.handlers")}
    assert BACKEND_NAME in discovered, "not installed: run `pip install -e .` in the repository"
    assert discovered[BACKEND_NAME].load() is handler_creator

    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    config = etcd_server.client_config()
    params = torch_api.RendezvousParameters(
        BACKEND_NAME, etcd_endpoint(etcd_server), unique_run_id("registry"), 1, 1, local_addr="127.0.0.1",
        user=config.user, password=config.password, timeout=60,
    )
    handler = get_rendezvous_handler(params)
    try:
        assert isinstance(handler, TorchrunRendezvousHandler)
        assert handler.get_backend() == BACKEND_NAME
        assert handler.use_agent_store
        info = handler.next_rendezvous()
        assert (info.rank, info.world_size) == (0, 1)
        info.store.set("probe", b"value")
        assert info.store.get("probe") == b"value"
        bootstrap = info.bootstrap_store_info
        client = dist.TCPStore(bootstrap.master_addr, bootstrap.master_port, is_master=False,
                                         timeout=timedelta(seconds=10))
        assert client.get(f"torch.rendezvous.{params.run_id}.0/probe") == b"value"  # workers see the agent store
        assert handler.num_nodes_waiting() == 0
        assert not handler.is_closed()
    finally:
        handler.shutdown()


@pytest.mark.slow
@pytest.mark.etcd
@pytest.mark.parametrize("share_store", [True, False], ids=["workers-reuse-agent-store", "workers-own-store"])
def test_one_torchrun_agent_runs_two_gloo_workers_that_all_reduce(etcd_server, tmp_path, share_store):
    process = start_torchrun(tmp_path, etcd_server, unique_run_id("one"), "1", "agent0", share_store=share_store)
    try:
        elapsed = wait_all([process], tmp_path)
    finally:
        stop_by_pid(process)
    reports = worker_reports(tmp_path, 2)
    assert sorted(report["rank"] for report in reports) == [0, 1]
    assert all(report["world_size"] == report["env_world_size"] == 2 for report in reports)
    assert all(report["rank"] == report["env_rank"] for report in reports)
    assert all(report["sum"] == 3.0 for report in reports)  # 1 + 2
    assert {report["use_agent_store"] for report in reports} == {str(share_store)}
    print(f"one torchrun agent (share_store={share_store}) took {elapsed:.1f}s")


@pytest.mark.slow
@pytest.mark.etcd
def test_two_torchrun_agents_with_one_run_id_form_one_world_of_four(etcd_server, tmp_path):
    run_id = unique_run_id("two")
    processes: list[Launched] = []
    try:
        processes = [start_torchrun(tmp_path, etcd_server, run_id, "2", f"agent{index}", console_script=True)
                     for index in range(2)]
        elapsed = wait_all(processes, tmp_path)
    finally:
        for process in processes:
            stop_by_pid(process)
    reports = worker_reports(tmp_path, 4)
    assert sorted(report["rank"] for report in reports) == [0, 1, 2, 3]
    assert all(report["world_size"] == report["env_world_size"] == 4 for report in reports)
    assert all(report["sum"] == 10.0 for report in reports)  # 1 + 2 + 3 + 4
    assert sorted(report["group_rank"] for report in reports) == [0, 0, 1, 1]
    assert len({tuple(report["master"]) for report in reports}) == 1
    print(f"two torchrun agents took {elapsed:.1f}s")


@pytest.mark.slow
@pytest.mark.etcd
def test_when_the_master_agent_dies_the_survivor_restarts_its_workers_into_a_smaller_world(etcd_server, tmp_path):
    run_id = unique_run_id("scale-down")
    conf = ",last_call_timeout=2,lease_ttl=3"
    processes: list[Launched] = []
    try:
        processes = [start_torchrun(tmp_path, etcd_server, run_id, "1:2", f"agent{index}", extra_conf=conf,
                                    hold_world=4) for index in range(2)]
        first = wait_for_reports(tmp_path, 4, processes)
        master_pid = next(report["agent_pid"] for report in first if report["group_rank"] == 0)
        master = next(process for process in processes if process.pid == master_pid)
        survivor = next(process for process in processes if process is not master)
        stop_by_pid(master, hard=True)  # no shutdown: its lease must expire (3 s) for the others to notice
        killed_at = time.monotonic()
        elapsed = wait_all([survivor], tmp_path)
    finally:
        for process in processes:
            stop_by_pid(process)
    second = worker_reports(tmp_path, 2)
    assert sorted(report["rank"] for report in second) == [0, 1]
    assert all(report["sum"] == 3.0 and report["agent_pid"] == survivor.pid for report in second)
    assert all(report["restart_count"] == 0 for report in second)  # a membership change is not a failure
    assert second[0]["master"] != first[0]["master"]  # the survivor hosts the new round's store
    assert time.monotonic() - killed_at < 60  # lease TTL + last call + worker start-up, with slack for load
    print(f"the survivor finished {elapsed:.1f}s after the master agent was killed")


# -- torch's --rdzv-conf keys (one mapping with elasticrun's) ---------------------------------
def test_the_plugin_maps_torchs_keys_as_elasticrun_does():
    from elastic.launch.cli import config_from_args

    conf = {"timeout": "5", "ca_cert": "/ca", "ssl_cert": "/c", "ssl_cert_key": "/k", "heartbeat_timeout": "3",
            "rank": "1", "read_timeout": "7", "etcd_prefix": "/p", "keep_alive_interval": "2"}
    params = torch_api.RendezvousParameters(BACKEND_NAME, "127.0.0.1:2379", "job", 1, 2, **conf)
    warnings: list[str] = []
    config = config_from_args(["--nnodes=1:2", f"--rdzv-backend={BACKEND_NAME}", "--rdzv-endpoint=127.0.0.1:2379",
                               "--rdzv-id=job", "--rdzv-conf", ",".join(f"{k}={v}" for k, v in conf.items()), "t.py"],
                              {}, warn=warnings.append)
    assert settings_from_params(params) == config.rendezvous
    assert backend_from_params(params) == config.backend
    assert our_conf(params).notes == tuple(warnings) and len(warnings) == 2  # heartbeat_timeout, rank


@pytest.mark.etcd
def test_torch_keys_without_effect_are_logged_once_when_the_handler_is_created(etcd_server, caplog):
    config = etcd_server.client_config()
    params = torch_api.RendezvousParameters(
        BACKEND_NAME, etcd_endpoint(etcd_server), unique_run_id("notes"), 1, 1, local_addr="127.0.0.1",
        user=config.user, password=config.password, timeout=60, heartbeat_timeout=30, use_libuv=0,
    )
    with caplog.at_level("WARNING", logger="elastic.rendezvous.torchrun_plugin"):
        handler = create_rdzv_handler(params)
    try:
        notes = [record.getMessage() for record in caplog.records if "has no effect" in record.getMessage()]
        assert len(notes) == 2 and params.run_id in notes[0]
        assert "heartbeat_timeout=30 has no effect" in notes[0] and "use_libuv=0 has no effect" in notes[1]
        assert handler._handler.settings.join_timeout == 60  # timeout is the join timeout, as elasticrun's etcd
    finally:
        handler.shutdown()
