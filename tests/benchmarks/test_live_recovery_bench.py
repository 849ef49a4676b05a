"""benchmarks/live_recovery.py's arguments and its summary of repeated runs (the runs themselves
are the live-recovery tests' scenarios, measured)."""

from __future__ import annotations

import pytest

from bench_modules import loaded


@pytest.fixture(scope="module")
def bench():
    with loaded("live_recovery_benchmark", "live_recovery.py") as module:
        yield module


def test_unknown_cases_are_refused_with_one_line(bench, capsys):
    with pytest.raises(SystemExit) as exited:
        bench.parse_args(["--cases", "crash,nodeloss"])
    assert exited.value.code == 2 and "unknown cases: nodeloss" in capsys.readouterr().err


def test_repeated_runs_are_summarised_by_median_and_range(bench):
    assert bench._summary([{"gap": 0.3}, {"gap": 0.1}, {"gap": 0.2}]) == {"gap": {"median": 0.2, "min": 0.1, "max": 0.3}}
    assert bench._summary([{"gap": 0.3}]) == {"gap": 0.3}


def test_side_by_side_quick_is_one_pair_one_crash_and_a_short_window(bench):
    args = bench.parse_args(["--side-by-side", "--quick"])
    assert (args.systems, args.faults, args.window, args.schedule) == (["live+prewarm", "torchrun"], ["crash"], 10.0, 0.0)
    assert bench.parse_args(["--side-by-side"]).window == 60.0 and bench.parse_args([]).window == 10.0


def test_side_by_side_refuses_unknown_systems_with_one_line(bench, capsys):
    with pytest.raises(SystemExit) as exited:
        bench.parse_args(["--side-by-side", "--systems", "live,deepspeed", "--faults", "crash,flood"])
    assert exited.value.code == 2 and "unknown systems or faults: deepspeed, flood" in capsys.readouterr().err


def test_state_mb_defaults_to_the_small_model_and_refuses_a_negative_size(bench, capsys):
    assert bench.parse_args(["--side-by-side"]).state_mb == 0
    assert bench.parse_args(["--side-by-side", "--state-mb", "100"]).state_mb == 100
    with pytest.raises(SystemExit) as exited:
        bench.parse_args(["--side-by-side", "--state-mb", "-1"])
    assert exited.value.code == 2 and "--state-mb not negative" in capsys.readouterr().err


def test_the_state_table_says_n_a_where_a_system_does_not_move_its_state_that_way(bench):
    with loaded("live_figures", "live_figures.py") as figures:
        states = {("crash", "torchrun"): figures.StateFigures(104_858_856, None, None, 0.279, 0.037, None),
                  ("crash", "live+prewarm"): figures.StateFigures(104_858_856, 0.089, 104_000_000, None, None, None)}
    rows = bench.live_side.state_table(states, ["live+prewarm", "torchrun"], 100).splitlines()[2:]
    assert rows[0].split()[-5:] == ["104.9", "0.089", "n/a", "n/a", "n/a"] and "--live-recovery" in rows[0]
    assert rows[1].split()[-5:] == ["104.9", "n/a", "0.279", "0.037", "n/a"] and "torchrun" in rows[1]


@pytest.mark.parametrize("system, prewarm", [("live", False), ("live+prewarm", True)])
def test_the_live_systems_start_their_replacements_as_their_names_say(bench, tmp_path, system, prewarm):
    """``live`` measures fresh replacement processes although ``--live-recovery`` pre-warms by
    default; ``live+prewarm`` measures the forks, with the modules a LiveTraining worker needs."""
    from elastic.launch.cli import config_from_args
    from elastic.launch.flags import LIVE_PREWARM_MODULES

    with loaded("live_systems_bench", "live_systems.py") as systems:
        argv, _ = systems.Run(system, tmp_path, "http://127.0.0.1:2379", 0.1)._argv(1)
    flags = argv[argv.index("elastic.run") + 1:]
    config = config_from_args(flags, {}, warn=lambda _: None)
    assert config.live_recovery and config.prewarm is prewarm
    if prewarm:
        assert config.prewarm_modules == LIVE_PREWARM_MODULES


@pytest.mark.parametrize("node, is_host", [(0, "true"), (1, "false")])
def test_only_torchruns_node_0_hosts_its_store(tmp_path, node, is_host):
    """On loopback both nodes match the endpoint's host; a second store server would bind the same
    port and split the job into two one-node jobs."""
    with loaded("live_systems_bench", "live_systems.py") as systems:
        argv, _ = systems.Run("torchrun", tmp_path, "http://127.0.0.1:2379", 0.1)._argv(node)
    conf = dict(item.split("=", 1) for item in argv[argv.index("--rdzv-conf") + 1].split(","))
    assert conf["is_host"] == is_host


@pytest.mark.parametrize("system", ["live", "live+prewarm", "prewarm", "torchrun"])
def test_a_slow_replacement_run_tells_every_systems_worker_how_long_a_restart_takes(bench, tmp_path, system):
    """live_train.py reads LIVE_LATE_START_SLEEP, the checkpoint and TorchFT workers
    LIVE_RESTART_SLEEP (TorchFT's run is left out: making one starts its lighthouse; its
    environment comes from the same line); a run without the fault sleeps nowhere."""
    with loaded("live_systems_bench", "live_systems.py") as systems:
        _, slow = systems.Run(system, tmp_path, "http://127.0.0.1:2379", 0.1, start_sleep=10.0)._argv(1)
        _, plain = systems.Run(system, tmp_path, "http://127.0.0.1:2379", 0.1)._argv(1)
    assert (slow["LIVE_LATE_START_SLEEP"], slow["LIVE_RESTART_SLEEP"]) == ("10", "10")
    assert (plain["LIVE_LATE_START_SLEEP"], plain["LIVE_RESTART_SLEEP"]) == ("0", "0")


def test_side_by_side_takes_the_slow_replacement_and_sigterm_faults(bench):
    args = bench.parse_args(["--side-by-side", "--faults", "slow_replacement,sigterm", "--systems", "live,torchft"])
    assert (args.faults, args.systems) == (["slow_replacement", "sigterm"], ["live", "torchft"])


def test_hsdp_side_by_side_runs_its_three_systems_for_a_crash_and_a_node_loss(bench):
    args = bench.parse_args(["--side-by-side", "--hsdp"])
    assert (args.systems, args.faults) == (["live+prewarm", "torchrun", "torchft"], ["crash", "node_loss"])
    args = bench.parse_args(["--side-by-side", "--hsdp", "--systems", "torchrun", "--faults", "node_loss"])
    assert (args.systems, args.faults) == (["torchrun"], ["node_loss"])


def test_hsdp_side_by_side_refuses_what_it_does_not_measure_with_one_line(bench, capsys):
    with pytest.raises(SystemExit) as exited:
        bench.parse_args(["--side-by-side", "--hsdp", "--faults", "crash,freeze"])
    assert exited.value.code == 2 and "--hsdp does not run freeze" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--side-by-side", "--hsdp", "--state-mb", "100"])


@pytest.mark.parametrize("system, script", [("live+prewarm", "examples/train_hsdp_live.py"),
                                            ("torchrun", "benchmarks/workers/hsdp_ckpt_train.py")])
def test_an_hsdp_run_starts_two_workers_per_node_of_its_hsdp_script(tmp_path, system, script):
    with loaded("live_systems_bench", "live_systems.py") as systems:
        run = systems.Run(system, tmp_path, "http://127.0.0.1:2379", 0.1, hsdp=True)
        argv, env = run._argv(1)
        assert run.world == 4
    assert argv[argv.index("--nproc-per-node") + 1] == "2" and any(arg.endswith(script) for arg in argv)
    if system == "live+prewarm":
        assert argv[argv.index("--hidden") + 1] == "64" and env["TMPDIR"] == str(tmp_path)


def test_an_hsdp_live_nodes_steps_are_its_shard_0_workers_and_its_other_events_everyones():
    with loaded("live_systems_bench", "live_systems.py") as systems:
        merged = systems.hsdp_node_events([
            [{"ev": "start", "shard": 1, "pid": 2, "t": 1.0}, {"ev": "step", "step": 0, "t": 2.1},
             {"ev": "recovery", "role": "receiver", "t": 3.0}],
            [{"ev": "start", "shard": 0, "pid": 1, "t": 1.1}, {"ev": "step", "step": 0, "t": 2.0}]])
        assert systems.hsdp_hidden(100) == 462_962 and systems.hsdp_hidden(0) == 64
    assert [(e["ev"], e["t"]) for e in merged] == [("start", 1.0), ("start", 1.1), ("step", 2.0), ("recovery", 3.0)]
