"""Live recovery: the real launchers side by side, and what a survivor and a joiner see.

Run:  python benchmarks/live_recovery.py --side-by-side [--systems ...]
                                         [--faults crash,node_loss,freeze,control_plane,slow_replacement,sigterm]
                                         [--window 60] [--schedule 120] [--state-mb 100] [--repetitions N] [--quick]
      python benchmarks/live_recovery.py --side-by-side --hsdp [--systems live+prewarm,torchrun,torchft]
                                         [--faults crash,node_loss] [--window 20] [--repetitions N]
      python benchmarks/live_recovery.py [--cases crash,freeze,transfer] [--repetitions N] [--json FILE]

``--side-by-side`` (``live_side.py``, ``live_systems.py``): the same small DDP model under
``elasticrun --live-recovery`` (pre-warmed, and with ``--no-prewarm``), ``elasticrun --prewarm``
(whole group restart, checkpoint every 10 steps), stock torchrun (likewise) and TorchFT 0.2.0 (installed
on demand into a venv under ``~/.cache/etcd-elastic-bench``; skipped with one line saying why if
it cannot be), for a worker crash, a node loss, a crash with the control plane SIGKILLed at
once (the etcd leader of a 3-member cluster; TorchFT's lighthouse), a crash whose replacement
(and every worker restarted with it) takes 10 s to be ready, and a SIGTERM to one node's
launcher (the node not started again), at step 25. ``--quick``: a
smoke of ``live+prewarm`` and ``torchrun`` with a crash and a 10 s window. ``--state-mb N``:
every worker's model has ~N MiB of parameters + Adam state (LIVE_BIG_MB), and a second table
gives per fault and system the state's size, the joiner's transfer from a live peer (live
systems), the checkpoint save and the reload after the fault (checkpointing systems, local disk)
and TorchFT's heal, from the workers' events (not for ``control_plane``).

``--side-by-side --hsdp``: HSDP instead (``live_systems.Run(hsdp=True)``): the model of
``examples/train_hsdp_live.py`` on 2 nodes x 2 workers (replicate 2, shard 2) under
``elasticrun --live-recovery`` (that example), stock torchrun (FSDP2 over a 2-D mesh, a sharded
``torch.distributed.checkpoint`` every 10 steps) and TorchFT 0.2.0 (FSDP2 per replica group,
its Manager's all-reduce across groups), for a worker crash and a node loss; a heal table gives
the ranks that took state in, bytes per rank and the slowest one's seconds.
``benchmarks/hsdp_heal.py`` times a ~100 MB HSDP heal beside a sharded checkpoint reload.

Without it, the worker-side figures, with :class:`support.live_agent.SimulatedAgent`
standing in for the agents (it hosts each round's TCPStore and writes the round lines as soon as
the test decides, so no rendezvous or lease time is in these figures except the lease TTL it
waits out for a freeze).

Every case runs the same small model as the tests (``tests/worker/workers/live_train.py``,
gloo, CPU, a DDP through :meth:`LiveTraining.ddp`), 2 nodes × 1 worker, one step every
``--step-seconds`` (the issue's 0.13 s).

  crash     SIGKILL worker w1 at step 25. The agent publishes round [w0] at once (T), starts a
            replacement, and publishes [w0, w1'] when it reports ``joining`` on its ready pipe.
  freeze    SIGSTOP w1 at step 25; after ``--lease-ttl`` the agent publishes [w0] (T); then it
            kills the frozen process and replaces it as for a crash.
  transfer  the joiner's state transfer, for the small model and for ``--big-mb`` MB of
            parameters + Adam state, beside a torch.save/torch.load of the same state on local
            disk (in this process; the save is fsync'ed).

Per case: the survivor's gap after T (T to its next committed step), its longest step gap,
steps it redid, seconds from the fault until the replaced slot commits a step again, the
replacement's seconds from its process start to its first step, the heal's transfer time and
bytes, and the useful-step fraction in ``--window`` seconds after the fault (steps committed ÷
steps at the pre-fault rate). The machine's load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "worker" / "workers"))
sys.path.insert(0, str(REPO / "tests"))  # support: the tests' helpers, not shipped

sys.path.insert(0, str(REPO / "benchmarks"))

import live_side  # noqa: E402
from support.live_agent import SimulatedAgent  # noqa: E402
from elastic.worker.rounds import Ready, ReadyEvent  # noqa: E402
from live_side import FAULTS  # noqa: E402
from live_systems import SYSTEMS  # noqa: E402

HSDP_SYSTEMS = ("live+prewarm", "torchrun", "torchft")
HSDP_FAULTS = ("crash", "node_loss")

WORKER = REPO / "tests" / "worker" / "workers" / "live_train.py"
CASES = ("crash", "freeze", "transfer")
FAULT_STEP = 25
OPTIONS = {"collective_timeout": 10, "store_timeout": 10, "form_timeout": 60, "round_wait_timeout": 60,
           "interrupt_grace": 0.5, "drain_timeout": 15}


def _env(steps: int, step_seconds: float, **extra: str) -> dict[str, str]:
    return {"PYTHONPATH": str(REPO), "LIVE_STEPS": str(steps), "LIVE_STEP_SLEEP": str(step_seconds),
            "LIVE_OPTIONS": json.dumps(OPTIONS), "OMP_NUM_THREADS": "1", "LIVE_CHECK": "0", **extra}


def _steps(events):
    return [event for event in events if event.get("ev") == "step"]


def _last(agent, slot) -> int:
    done = _steps(agent.events(slot))
    return done[-1]["step"] if done else -1


def _wait_ready(agent, slot, round_number, timeout):
    seen: list[Ready] = []

    def joining():
        seen.extend(agent.ready_lines(slot))
        return any(line.event is ReadyEvent.JOINING and line.round == round_number for line in seen)

    agent.wait_for(joining, timeout, f"{slot} joining round {round_number}")


def _finish(agent, slots, timeout):
    for slot in slots:
        proc = agent.workers[slot].proc
        agent.wait_for(lambda: proc.poll() is not None, timeout, f"{slot} to exit")
        if proc.returncode != 0:
            raise RuntimeError(f"{slot} exited {proc.returncode}\n{agent.describe()}")


def _recoveries(events):
    return [event for event in events if event.get("ev") == "recovery"]


def _survivor_figures(events, fault_at, arrived, window):
    steps = _steps(events)
    times = [event["t"] for event in steps]
    numbers = [event["step"] for event in steps]
    before = [b - a for a, b in zip(times, times[1:]) if b <= fault_at]
    rate = statistics.median(before) if before else float("nan")
    useful = sum(1 for t in times if fault_at < t <= fault_at + window)
    after = next(t for t in times if t > arrived)
    return {
        "gap_after_round_s": after - arrived,
        "longest_step_gap_s": max(b - a for a, b in zip(times, times[1:])),
        "steps_redone": len(numbers) - len(set(numbers)),
        "undisturbed_step_s": rate,
        "useful_fraction": useful / (window / rate) if rate == rate else float("nan"),
    }


def _replacement(agent, fault_at, slot):
    events = agent.events(slot)
    start = next(event["t"] for event in events if event["ev"] == "start")
    first = _steps(events)[0]["t"]
    heal = _recoveries(events)[0]
    return {
        "failed_slot_back_s": first - fault_at,
        "replacement_start_to_first_step_s": first - start,
        "transfer_s": heal["healed"] - heal["formed"],
        "transfer_bytes": heal["nbytes"],
    }


def run_fault(kind: str, workdir: Path, step_seconds: float, lease_ttl: float, window: float, timeout: float) -> dict:
    total = FAULT_STEP + int((window + 20) / step_seconds)
    agent = SimulatedAgent(WORKER, workdir, _env(total, step_seconds), run_id=f"bench-{kind}", ready_pipe=True)
    try:
        first = agent.new_round(["w0", "w1"])
        for slot in first.slots:
            agent.start(slot, first)
        agent.wait_for(lambda: _last(agent, "w0") >= FAULT_STEP, timeout, f"step {FAULT_STEP}")
        if kind == "crash":
            fault_at = agent.kill("w1")
        else:
            fault_at = agent.freeze("w1")
            time.sleep(lease_ttl)
        arrived = agent.publish(agent.new_round(["w0"]))
        if kind == "freeze":
            agent.kill("w1")
        joined = agent.new_round(["w0", "w2"])
        agent.start("w2", joined)
        _wait_ready(agent, "w2", joined.number, timeout)
        agent.publish(joined, ["w0"])
        _finish(agent, ["w0", "w2"], timeout + total * step_seconds)
        figures = _survivor_figures(agent.events("w0"), fault_at, arrived, window)
        figures.update(_replacement(agent, fault_at, "w2"))
        lost = next(r for r in _recoveries(agent.events("w0")) if r["round"] == 1)
        figures["survivor_round_to_formed_s"] = lost["healed"] - arrived
        return figures
    finally:
        agent.close()


def run_transfer(workdir: Path, big_mb: int, step_seconds: float, timeout: float) -> dict:
    """A joiner heals from a running worker; returns its transfer time and bytes."""
    extra = {"LIVE_BIG_MB": str(big_mb)} if big_mb else {}
    agent = SimulatedAgent(WORKER, workdir, _env(10_000_000, step_seconds, **extra), run_id=f"bench-transfer-{big_mb}",
                           ready_pipe=True)
    try:
        alone = agent.new_round(["w0"])
        agent.start("w0", alone)
        agent.wait_for(lambda: _last(agent, "w0") >= 5, timeout, "w0 at step 5")
        joined = agent.new_round(["w0", "w1"])
        agent.start("w1", joined)
        _wait_ready(agent, "w1", joined.number, timeout)
        agent.publish(joined, ["w0"])
        agent.wait_for(lambda: _last(agent, "w1") >= 0, timeout, "w1's first step")
        heal = _recoveries(agent.events("w1"))[0]
        return {"transfer_s": heal["healed"] - heal["formed"], "transfer_bytes": heal["nbytes"]}
    finally:
        agent.close()


def checkpoint_reload(big_mb: int) -> dict:
    """torch.save (fsync'ed) and torch.load + load_state_dict of the same state, on local disk."""
    import torch

    from live_model import make_model

    model = make_model(0, hidden=big_mb * 1024 * 1024 // (3 * 4 * 18) if big_mb else 32)  # as live_train.py
    opt = torch.optim.Adam(model.parameters(), lr=1e-3) if big_mb else torch.optim.SGD(model.parameters(), lr=0.05)
    model(torch.zeros(1, 16)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "opt": opt.state_dict()}
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "checkpoint.pt")
        started = time.monotonic()
        with open(path, "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
        saved = time.monotonic()
        loaded = torch.load(path, weights_only=True)
        model.load_state_dict(loaded["model"])
        opt.load_state_dict(loaded["opt"])
        done = time.monotonic()
        size = os.path.getsize(path)
    return {"save_s": saved - started, "load_s": done - saved, "bytes": size}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"any of {','.join(CASES)}")
    parser.add_argument("--step-seconds", type=float, default=0.12, help="sleep per step, the model's compute (default 0.12)")
    parser.add_argument("--lease-ttl", type=float, default=2.0, help="freeze: seconds before the agent publishes (default 2)")
    parser.add_argument("--window", type=float, help="seconds after the fault for the useful-step fraction "
                        "(default 10; 60 with --side-by-side)")
    parser.add_argument("--big-mb", type=int, default=100, help="transfer: MB of parameters + Adam state (default 100)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for any one thing (default 120)")
    parser.add_argument("--repetitions", type=int, default=1,
                        help="runs per case (side by side: per fault and system); medians are printed (default 1)")
    parser.add_argument("--json", help="also write the figures (and every run's) to this file")
    side = parser.add_argument_group("launcher-level side by side (--side-by-side)")
    side.add_argument("--side-by-side", action="store_true", help="run the real launchers side by side instead")
    side.add_argument("--systems", default=",".join(SYSTEMS), help=f"any of {','.join(SYSTEMS)}")
    side.add_argument("--faults", default=",".join(FAULTS), help=f"any of {','.join(FAULTS)}")
    side.add_argument("--schedule", type=float, default=0.0,
                      help="also: a fault every 10 s for this many seconds, per system (default: none)")
    side.add_argument("--rejoin-timeout", type=float, default=0.5,
                      help="--rdzv-conf rejoin_timeout of the live systems (default 0.5)")
    side.add_argument("--state-mb", type=int, default=0,
                      help="every worker's model: ~N MiB of parameters + Adam state (default 0: the small model)")
    side.add_argument("--keep-logs", action="store_true",
                      help="keep every run's worker and launcher logs (kept anyway when a run failed)")
    side.add_argument("--quick", action="store_true", help="a smoke: live+prewarm and torchrun, a crash, a 10 s window")
    side.add_argument("--hsdp", action="store_true",
                      help=f"HSDP: 2 nodes x 2 workers, FSDP2 (replicate 2, shard 2); systems {','.join(HSDP_SYSTEMS)} "
                           f"(default), faults {','.join(HSDP_FAULTS)}")
    args = parser.parse_args(argv)
    if args.repetitions < 1:
        parser.error("--repetitions must be at least 1")
    if args.side_by_side:
        return _side_args(parser, args)
    args.window = 10.0 if args.window is None else args.window
    args.cases = [case for case in args.cases.split(",") if case]
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        parser.error(f"unknown cases: {', '.join(unknown)} (choose from {', '.join(CASES)})")
    return args


def _side_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    if args.hsdp:
        return _hsdp_args(parser, args)
    args.systems = [name for name in args.systems.split(",") if name]
    args.faults = [name for name in args.faults.split(",") if name]
    if args.quick:
        args.systems = [name for name in ("live+prewarm", "torchrun") if name in args.systems]
        args.faults, args.window, args.schedule = ["crash"], args.window or 10.0, 0.0
    args.window = 60.0 if args.window is None else args.window
    unknown = sorted(set(args.systems) - set(SYSTEMS) | set(args.faults) - set(FAULTS))
    if unknown:
        parser.error(f"unknown systems or faults: {', '.join(unknown)} (systems {', '.join(SYSTEMS)}; "
                     f"faults {', '.join(FAULTS)})")
    if args.step_seconds <= 0 or args.window <= 0 or args.schedule < 0 or args.state_mb < 0:
        parser.error("--step-seconds and --window must be positive, --schedule and --state-mb not negative")
    return args


def _hsdp_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """``--side-by-side --hsdp``: its own default systems, and only the faults it measures."""
    given = {action.dest: action.default for action in parser._actions}
    systems = HSDP_SYSTEMS if args.systems == given["systems"] else args.systems
    faults = HSDP_FAULTS if args.faults == given["faults"] else args.faults
    args.systems = [name for name in systems.split(",") if name] if isinstance(systems, str) else list(systems)
    args.faults = [name for name in faults.split(",") if name] if isinstance(faults, str) else list(faults)
    if args.quick:
        args.systems = [name for name in ("live+prewarm", "torchrun") if name in args.systems]
        args.faults, args.window = ["crash"], args.window or 10.0
    args.window = 60.0 if args.window is None else args.window
    unknown = sorted(set(args.systems) - set(HSDP_SYSTEMS) | set(args.faults) - set(HSDP_FAULTS))
    if unknown:
        parser.error(f"--hsdp does not run {', '.join(unknown)} (systems {', '.join(HSDP_SYSTEMS)}; "
                     f"faults {', '.join(HSDP_FAULTS)})")
    if args.schedule or args.state_mb:
        parser.error("--hsdp takes neither --schedule nor --state-mb (benchmarks/hsdp_heal.py times a big heal)")
    if args.step_seconds <= 0 or args.window <= 0:
        parser.error("--step-seconds and --window must be positive")
    return args


def _summary(runs: list[dict]) -> dict:
    """Per figure: the median, and the range when there were several runs."""
    out = {}
    for key in runs[0]:
        values = sorted(run[key] for run in runs)
        out[key] = {"median": statistics.median(values), "min": values[0], "max": values[-1]} if len(values) > 1 else values[0]
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.side_by_side:
        try:
            return live_side.main(args)
        except KeyboardInterrupt as interrupted:
            print(f"interrupted ({interrupted or 'Ctrl-C'}); every process it started was stopped", file=sys.stderr)
            return 130
    runs: dict[str, list[dict]] = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="live-recovery-") as directory:
        for repetition in range(args.repetitions):
            for case in args.cases:
                if case in ("crash", "freeze"):
                    case_dir = Path(directory) / f"{case}-{repetition}"
                    case_dir.mkdir()
                    runs.setdefault(case, []).append(
                        run_fault(case, case_dir, args.step_seconds, args.lease_ttl, args.window, args.timeout))
                    continue
                for mb in (0, args.big_mb):
                    case_dir = Path(directory) / f"transfer-{mb}-{repetition}"
                    case_dir.mkdir()
                    live = run_transfer(case_dir, mb, args.step_seconds, args.timeout)
                    disk = checkpoint_reload(mb)
                    runs.setdefault(f"transfer_{mb or 'small'}", []).append(
                        {"live_transfer_s": live["transfer_s"], "live_bytes": live["transfer_bytes"],
                         "checkpoint_save_s": disk["save_s"], "checkpoint_load_s": disk["load_s"],
                         "checkpoint_bytes": disk["bytes"]})
    results = {"load_before": load_before, "load_after": os.getloadavg(), "cpus": os.cpu_count(),
               "repetitions": args.repetitions, **{name: _summary(case_runs) for name, case_runs in runs.items()}}
    print(f"load average (1/5/15 min) before {results['load_before']}, after {results['load_after']} "
          f"on {results['cpus']} CPUs; {args.repetitions} run(s) per case")
    for name, case_runs in runs.items():
        print(f"{name}:")
        for key, figure in results[name].items():
            text = (f"{figure['median']:.3f} (min {figure['min']:.3f}, max {figure['max']:.3f})"
                    if isinstance(figure, dict) else f"{figure:.3f}")
            print(f"  {key:36s} {text}")
    if args.json:
        Path(args.json).write_text(json.dumps({**results, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
