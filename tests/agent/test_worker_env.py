"""Worker environment and command line: unit cases, and a key-by-key comparison with torchrun."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from elastic.agent.worker_env import (
    OMP_NOTICE,
    RUN_PATH_BOOTSTRAP,
    fixed_worker_env,
    omp_threads_notice,
    python_executable,
    worker_argv,
    worker_env,
)
from elastic.config import Entrypoint, LaunchConfig
from elastic.rendezvous.api import RendezvousInfo

TORCHRUN_KEYS = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
}  # fmt: skip


def config(nproc=2, **kw) -> LaunchConfig:
    kw.setdefault("entrypoint", Entrypoint("script", "train.py"))
    return LaunchConfig(min_nodes=1, max_nodes=4, nproc_per_node=nproc, **kw)


def rdzv(group_rank=0, group_world_size=1, run_id="job", addr="10.0.0.1", port=29500):
    return RendezvousInfo(
        run_id=run_id, round=0, group_rank=group_rank, group_world_size=group_world_size,
        master_addr=addr, master_port=port, members=(),
    )


def env_for(base=None, cfg=None, info=None, local_rank=0, **kw):
    kw.setdefault("restart_count", 0)
    kw.setdefault("error_file", "/logs/error.json")
    kw.setdefault("use_agent_store", False)
    return worker_env(base or {}, cfg or config(), info or rdzv(), local_rank, **kw)


def test_the_fixed_part_is_what_every_round_and_attempt_shares():
    """What a pre-warmed template imports with: a subset of every attempt's environment."""
    base = {"PATH": "/bin", "PYTHONPATH": "/src"}
    fixed = fixed_worker_env(base, config(nproc=2), local_rank=1)
    for info, restarts in ((rdzv(0, 1, port=1), 0), (rdzv(2, 3, run_id="j2", port=2), 5)):
        env = env_for(base, config(nproc=2), info, local_rank=1, restart_count=restarts)
        assert fixed.items() <= env.items()
    assert set(fixed) - set(base) == {"LOCAL_RANK", "LOCAL_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_MAX_RESTARTS",
                                      "TORCHELASTIC_SIGNALS_TO_HANDLE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                                      "OMP_NUM_THREADS"}


# -- ranks and sizes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "group_rank, group_world, nproc, local_rank, rank, world",
    [(0, 1, 1, 0, 0, 1), (0, 1, 2, 1, 1, 2), (1, 3, 4, 2, 6, 12), (2, 3, 4, 3, 11, 12)],
)
def test_ranks_follow_group_rank_times_nproc_plus_local_rank(
    group_rank, group_world, nproc, local_rank, rank, world
):
    env = env_for(cfg=config(nproc), info=rdzv(group_rank, group_world), local_rank=local_rank)
    assert env["RANK"] == env["ROLE_RANK"] == str(rank)
    assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == str(world)
    assert env["LOCAL_RANK"] == str(local_rank)
    assert env["LOCAL_WORLD_SIZE"] == str(nproc)
    assert env["GROUP_RANK"] == str(group_rank)
    assert env["GROUP_WORLD_SIZE"] == str(group_world)


def test_run_master_restart_and_error_file_values():
    env = env_for(
        cfg=config(max_restarts=5, role="trainer", signals_to_handle=("SIGTERM", "SIGUSR1")),
        info=rdzv(run_id="r-42", addr="master.local", port=1234),
        restart_count=2, error_file="/x/3/error.json", use_agent_store=True,
    )
    assert env["ROLE_NAME"] == "trainer"
    assert env["MASTER_ADDR"] == "master.local" and env["MASTER_PORT"] == "1234"
    assert env["TORCHELASTIC_RUN_ID"] == "r-42"
    assert env["TORCHELASTIC_RESTART_COUNT"] == "2"
    assert env["TORCHELASTIC_MAX_RESTARTS"] == "5"
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    assert env["TORCHELASTIC_ERROR_FILE"] == "/x/3/error.json"
    assert env["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGUSR1"
    assert env_for(use_agent_store=False)["TORCHELASTIC_USE_AGENT_STORE"] == "False"


def test_base_environment_is_inherited_and_not_mutated():
    base = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "2,3", "RANK": "stale"}
    env = env_for(base=dict(base))
    assert env["PATH"] == "/bin" and env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["RANK"] == "0"
    assert base == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "2,3", "RANK": "stale"}


def test_nccl_async_error_handling_defaults_to_1_and_keeps_the_inherited_value():
    assert env_for()["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env_for(base={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"})[
        "TORCH_NCCL_ASYNC_ERROR_HANDLING"
    ] == "3"


def test_torchrun_does_not_set_the_legacy_or_dump_nccl_variables():
    env = env_for()
    assert "NCCL_ASYNC_ERROR_HANDLING" not in env
    assert "TORCH_NCCL_DUMP_ON_TIMEOUT" not in env
    assert "TORCHELASTIC_TIMER_FILE" not in env


@pytest.mark.parametrize(
    "base, nproc, expected",
    [
        ({}, 2, "1"),
        ({}, 1, None),
        ({"OMP_NUM_THREADS": "8"}, 2, "8"),
        ({"OMP_NUM_THREADS": "4"}, 1, "4"),
    ],
)
def test_omp_num_threads_is_1_only_when_unset_and_several_workers(base, nproc, expected):
    env = env_for(base=base, cfg=config(nproc))
    assert env.get("OMP_NUM_THREADS") == expected
    assert (omp_threads_notice(base, nproc) is not None) == (expected == "1" and not base)


def test_the_omp_notice_is_one_line_naming_the_value_and_the_workers():
    notice = omp_threads_notice({}, 4)
    assert notice == OMP_NOTICE.format(nproc=4) and "\n" not in notice
    assert notice.startswith("OMP_NUM_THREADS is not set: each of this node's 4 workers gets OMP_NUM_THREADS=1")


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"local_rank": 2}, r"local rank \(2\) must be in \[0, 2\)"),
        ({"local_rank": -1}, r"local rank \(-1\)"),
        ({"restart_count": -1}, r"restart count \(-1\) must not be negative"),
        ({"info": rdzv(group_rank=1, group_world_size=1)}, r"group rank \(1\) must be in"),
    ],
)
def test_inconsistent_inputs_are_rejected(kw, message):
    with pytest.raises(ValueError, match=message):
        env_for(**kw)


# -- command line ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entrypoint, argv",
    [
        (Entrypoint("script", "t.py", ("--lr", "1")), ["PY", "-u", "t.py", "--lr", "1"]),
        (Entrypoint("module", "pkg.train", ("a",)), ["PY", "-u", "-m", "pkg.train", "a"]),
        (Entrypoint("command", "/bin/echo", ("hi",)), ["/bin/echo", "hi"]),
        (
            Entrypoint("run_path", "t.py", ("x",)),
            ["PY", "-u", "-c", RUN_PATH_BOOTSTRAP, "t.py", "x"],
        ),
    ],
)
def test_worker_argv_matches_torchruns_command_for_each_kind(entrypoint, argv):
    assert worker_argv(entrypoint, python="PY") == argv


def test_local_rank_macro_is_substituted_like_torchrun():
    ep = Entrypoint("script", "t.py", ("--dev=cuda:${local_rank}", "$HOME", "${other}"))
    assert worker_argv(ep, python="PY", local_rank=3) == [
        "PY", "-u", "t.py", "--dev=cuda:3", "$HOME", "${other}",
    ]  # fmt: skip
    assert worker_argv(ep, python="PY")[3] == "--dev=cuda:${local_rank}"


@pytest.mark.parametrize("entrypoint", [Entrypoint("binary", "x"), Entrypoint("script", "")])
def test_bad_entrypoints_are_rejected(entrypoint):
    with pytest.raises(ValueError):
        worker_argv(entrypoint)


def test_python_exec_overrides_the_interpreter_like_torchrun():
    assert python_executable({"PYTHON_EXEC": "/opt/py"}) == "/opt/py"
    assert python_executable({}) == sys.executable


def test_run_path_bootstrap_runs_the_script_as_main_with_its_argv(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import sys\nprint(__name__, sys.argv)\n")
    argv = worker_argv(Entrypoint("run_path", str(script), ("a", "b")))
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    assert out.strip() == f"__main__ {[str(script), 'a', 'b']}"


# -- against real torchrun ---------------------------------------------------------------------

DUMP_ENV = textwrap.dedent(
    """
    import json, os, sys
    with open(os.path.join(sys.argv[1], "env_%s.json" % os.environ["LOCAL_RANK"]), "w") as f:
        cmdline = open("/proc/self/cmdline", "rb").read().decode().split(chr(0))[:-1]
        json.dump({"env": dict(os.environ), "cmdline": cmdline}, f)
    """
)


@pytest.mark.slow
@pytest.mark.needs_torch
def test_environment_matches_torchrun_key_by_key(tmp_path):
    """Run ``torchrun --standalone --nproc-per-node=2`` and rebuild each worker's env and command.

    Run-specific values (port, run id, error file path) are compared by form.
    """
    (tmp_path / "dump_env.py").write_text(DUMP_ENV)
    out = tmp_path / "out"
    out.mkdir()
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCHELASTIC_", "PET_", "OMP_", "TORCH_NCCL"))
        and k not in {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    }
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "--log-dir", str(tmp_path / "logs"), str(tmp_path / "dump_env.py"), str(out)],
        env=base, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Setting OMP_NUM_THREADS environment variable for each process to be 1" in proc.stderr  # ours: one line

    for local_rank in (0, 1):
        dump = json.loads((out / f"env_{local_rank}.json").read_text())
        theirs = dump["env"]
        script = Entrypoint("script", str(tmp_path / "dump_env.py"), (str(out),))
        assert dump["cmdline"] == worker_argv(script, python=sys.executable, local_rank=local_rank)
        run_id = theirs["TORCHELASTIC_RUN_ID"]
        ours = worker_env(
            base,
            config(2, signals_to_handle=("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")),
            rdzv(run_id=run_id, addr="localhost", port=int(theirs["MASTER_PORT"])),
            local_rank,
            restart_count=0,
            error_file=f"/ours/{run_id}/attempt_0/{local_rank}/error.json",
            use_agent_store=True,  # the c10d rendezvous of --standalone hosts the agent store
        )
        assert TORCHRUN_KEYS <= set(theirs)
        assert set(ours) == set(theirs), (set(ours) ^ set(theirs))
        by_form = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"}
        for key in sorted(set(theirs) - by_form):
            assert ours[key] == theirs[key], key
        assert re.fullmatch(r"[1-9][0-9]{0,4}", theirs["MASTER_PORT"])
        assert re.fullmatch(r"[0-9a-f-]{36}", run_id)
        suffix = f"/attempt_0/{local_rank}/error.json"
        assert theirs["TORCHELASTIC_ERROR_FILE"].endswith(suffix)
        assert ours["TORCHELASTIC_ERROR_FILE"].endswith(suffix)
        assert theirs["OMP_NUM_THREADS"] == "1"


# -- mixed nodes: the round record's layout -------------------------------------------------------


def mixed_round(shapes, node):
    """A RendezvousInfo for ``node`` of a round whose members run ``shapes`` = (role, nproc)."""
    from elastic.rendezvous.records import Member, RoundRecord

    record = RoundRecord(2, tuple(Member(f"n{i}", "10.0.0.1", 29500, size, role) for i, (role, size) in enumerate(shapes)),
                         restart_count=1)
    rank = record.rank_of(node)
    return RendezvousInfo("job", 2, rank, record.group_world_size, "10.0.0.1", 29500, record.members,
                          record.restart_count, record.layout_of(node))


@pytest.mark.parametrize(
    "shapes, node, nproc, role, expected",
    [
        # torchrun's answer for A --nproc-per-node=2, B --nproc-per-node=1: 0/3, 1/3 | 2/3.
        ([("default", 2), ("default", 1)], "n0", 2, "default", [(0, 3, 0, 3), (1, 3, 1, 3)]),
        ([("default", 2), ("default", 1)], "n1", 1, "default", [(2, 3, 2, 3)]),
        ([("default", 3), ("default", 1), ("default", 2)], "n2", 2, "default", [(4, 6, 4, 6), (5, 6, 5, 6)]),
        # Two roles: role ranks count within the role, global ranks across both.
        ([("trainer", 2), ("ps", 1), ("trainer", 1)], "n2", 1, "trainer", [(3, 4, 2, 3)]),
        ([("trainer", 2), ("ps", 1), ("trainer", 1)], "n1", 1, "ps", [(2, 4, 0, 1)]),
    ],
)
def test_mixed_nodes_get_torchruns_ranks_from_the_round_record(shapes, node, nproc, role, expected):
    info = mixed_round(shapes, node)
    for local_rank, (rank, world, role_rank, role_world) in enumerate(expected):
        env = env_for(cfg=config(nproc, role=role), info=info, local_rank=local_rank)
        assert (env["RANK"], env["WORLD_SIZE"], env["ROLE_RANK"], env["ROLE_WORLD_SIZE"]) == (
            str(rank), str(world), str(role_rank), str(role_world))
        assert env["LOCAL_WORLD_SIZE"] == str(nproc)
        assert env["GROUP_WORLD_SIZE"] == str(len(shapes))


def test_a_layout_that_disagrees_with_this_nodes_nproc_is_refused():
    info = mixed_round([("default", 2), ("default", 1)], "n1")
    with pytest.raises(ValueError, match="gives this node 1 workers, but it runs 2"):
        env_for(cfg=config(2), info=info)
