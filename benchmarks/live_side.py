"""The launcher-level side-by-side mode of ``benchmarks/live_recovery.py``.

For every system of :mod:`live_systems` and every fault (``crash``: SIGKILL of node 1's worker;
``node_loss``: SIGKILL of node 1's whole process tree, then the node is started again;
``freeze``: SIGSTOP of node 1's whole process tree, SIGCONT after ``FREEZE_S`` (a hung machine
that comes back: no connection resets, so only liveness timeouts see it);
``control_plane``: a crash, and within ~10 ms the control plane SIGKILLed and not started again:
the leader of a 3-member etcd cluster the elasticrun systems run against for this fault, TorchFT's
lighthouse; stock torchrun has none apart from node 0, the survivor, and is not run;
``slow_replacement``: a crash where every worker started after its node's first (the
replacement; for torchrun the survivor's restarted worker too) sleeps :data:`SLOW_START_S`
before its training starts; ``sigterm``: SIGTERM to node 1's launcher alone (elasticrun's agent,
torchrun, the replica group's torchrun), as a Kubernetes eviction or a spot instance's notice,
and the node is not started again: the survivors' cost of a graceful leave), at the
survivor's step 25: the survivor's longest step gap, the steps it redid, seconds until node 1
commits a step again, and goodput over ``--window`` seconds after the fault (useful steps ÷ the
steps at the pre-fault rate). ``--schedule S``: one fault every 10 s for S seconds, alternating
crash and node loss, and the useful-step fraction over those S seconds. Times are the workers'
``time.monotonic()`` stamps. ``--repetitions N`` runs the whole plan N times and reports, per
fault and system, the run with the median gap (per schedule, the median fraction) whole, with the
range over the runs in its note.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # support: the tests' helpers, not shipped

from live_figures import (FaultFigures, back_cell, commits, fault_figures, first_after, gap_cell, gap_note,  # noqa: E402
                          outcome, ratio, shard_heal_figures, state_figures, step_period,
                          useful_and_redone)
from live_systems import LABELS, REPO, Run, SystemFailed, torchft_python  # noqa: E402

FAULT_STEP = 25
FAULTS = ("crash", "node_loss", "freeze", "control_plane", "slow_replacement", "sigterm")
SLOW_START_S = 10.0
"""How long a worker of the ``slow_replacement`` fault takes to be ready once started (a sleep
before its training starts): a GPU's initialisation and a model's construction."""
FREEZE_S = 10.0
"""How long the ``freeze`` fault keeps node 1 stopped: five lease TTLs, so every system's liveness
check has run out well before the thaw."""
SCHEDULE_FAULTS = ("crash", "node_loss")
ETCD_SYSTEMS = ("live", "live+prewarm", "prewarm")
ETCD_MEMBERS = 3
NO_CONTROL_PLANE = ("not run: its c10d store is node 0's agent, the survivor; no control plane apart from a node "
                    "to kill in this layout (its crash row is the same fault)")
SCHEDULE_EVERY_S = 10.0
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "etcd-elastic-bench"


@dataclass(frozen=True)
class ScheduleFigures:
    """A fault schedule's outcome for one system: useful steps over the schedule and faults dealt."""

    useful: int
    undisturbed: float
    redone: int
    faults: int
    skipped: int

    @property
    def fraction(self) -> float:
        return self.useful / self.undisturbed if self.undisturbed else float("nan")


def _start(run: Run) -> None:
    run.start_node(0)
    run.start_node(1)

    def both_training() -> bool:
        survivor = commits(run.events(0))
        return (bool(survivor) and survivor[-1].step >= FAULT_STEP and bool(commits(run.events(1)))
                and one_world(run.events(0), run.events(1), world=run.world))

    run.wait_for(f"step {FAULT_STEP} on both nodes, in one world of {run.world}", both_training)


def one_world(*logs: list[dict], world: int | None = None) -> bool:
    """Whether every log's last step was taken in a world of ``world`` ranks (default: one per
    log), not two jobs of one node each."""
    world = len(logs) if world is None else world
    last = [next((e for e in reversed(events) if e.get("ev") == "step"), None) for events in logs]
    return all(event is not None and event.get("world") == world for event in last)


def median_run(costs: list[float]) -> int:
    """The index of the median run by ``costs`` (higher is worse; of an even count, the worse of
    the two middle ones). Its figures are reported whole, so a row is always one run that happened."""
    order = sorted(range(len(costs)), key=lambda index: costs[index])
    return order[len(order) // 2]


def spread_note(runs: list[FaultFigures]) -> str:
    """The range over several runs of one fault and system; empty for one run."""
    if len(runs) < 2:
        return ""
    gaps = sorted(figures.longest_gap_s for figures in runs)
    goodputs = sorted(figures.goodput for figures in runs)
    redone = sorted(figures.steps_redone for figures in runs)
    stalled = sum(figures.stalled for figures in runs)
    return (f"median of {len(runs)} runs: gap {gaps[0]:.2f}-{gaps[-1]:.2f} s, goodput {goodputs[0]:.3f}-"
            f"{goodputs[-1]:.3f}, redone {redone[0]}-{redone[-1]}" + (f", {stalled} stalled" if stalled else ""))


def heal_spread_note(heals: list) -> str:
    """``--hsdp``: the heal's seconds and bytes per rank over several runs; empty for one run."""
    seconds = sorted(heal.seconds for heal in heals if heal is not None and heal.seconds is not None)
    sizes = sorted(heal.bytes_per_rank for heal in heals if heal is not None and heal.bytes_per_rank is not None)
    if len(heals) < 2 or not seconds:
        return ""
    return (f"heal {statistics.median(seconds):.3f} s (median; {seconds[0]:.3f}-{seconds[-1]:.3f}), "
            f"{sizes[0]}-{sizes[-1]} bytes/rank" if sizes else f"heal {seconds[0]:.3f}-{seconds[-1]:.3f} s")


def _hold(run: Run, until: float) -> None:
    """Let the job train until ``until`` (monotonic), failing if a node's launcher exits."""
    while time.monotonic() < until:
        run.check_running()
        time.sleep(0.1)


def _fault(run: Run, kind: str) -> float | None:
    return run.lose(1) if kind == "node_loss" else run.crash(1)


def start_sleep(kind: str) -> float:
    """Seconds a worker started after its node's first sleeps before training, in fault ``kind``'s
    runs: :data:`SLOW_START_S` for ``slow_replacement``, else 0."""
    return SLOW_START_S if kind == "slow_replacement" else 0.0


def sigterm_outcome(figures: FaultFigures, exits: dict[int, int], node: int = 1) -> str:
    """What a reader must know after ``node``'s launcher was SIGTERMed and not started again:
    how it exited (or that it had not by the window's end), then :func:`outcome` for the rest,
    less what the fault means (``node`` never committing again, its own exit)."""
    left = {other: code for other, code in exits.items() if other != node}
    rest = outcome(figures, left).split("; ")
    rest = [part for part in rest if part and part != f"node {node} never committed again"]
    if figures.back_s is not None:
        rest.append(f"node {node} committed again {figures.back_s:.2f} s after the SIGTERM")
    said = (f"node {node}'s launcher exited {exits[node]} after the SIGTERM" if node in exits
            else f"node {node}'s launcher still running at the window's end")
    return "; ".join([said, *rest])


def measure_sigterm(run: Run, window: float) -> tuple[FaultFigures, str]:
    """SIGTERM node 1's launcher alone and hold through ``window`` without starting it again.

    Raises:
        SystemFailed: the job did not reach the fault.
    """
    _start(run)
    fault_at = run.terminate(1)
    exits = _hold_through(run, fault_at + window + 0.5)
    figures = fault_figures(commits(run.events(0)), commits(run.events(1)), fault_at, window)
    return figures, sigterm_outcome(figures, exits)


def measure_freeze(run: Run, window: float) -> tuple[FaultFigures, str]:
    """SIGSTOP node 1's tree for :data:`FREEZE_S`, then SIGCONT it, and hold through ``window``.
    A launcher exiting after it is a result, not a failure.

    Raises:
        SystemFailed: the job did not reach the fault.
    """
    _start(run)
    fault_at = run.freeze(1)
    _hold(run, fault_at + FREEZE_S)
    thawed_at = run.thaw(1)
    return _through_window(run, fault_at, window, f"thawed {thawed_at - fault_at:.1f} s after the SIGSTOP")


def _through_window(run: Run, fault_at: float, window: float, note: str) -> tuple[FaultFigures, str]:
    """Hold a run whose launchers may exit through ``window`` after ``fault_at``: its figures, and
    ``note`` with what else a reader must know (:func:`outcome`)."""
    exits = _hold_through(run, fault_at + window + 0.5)
    figures = fault_figures(commits(run.events(0)), commits(run.events(1)), fault_at, window)
    after = outcome(figures, exits)
    return figures, note + (f"; {after}" if after else "")


def _hold_through(run: Run, until: float) -> dict[int, int]:
    """Let the job run until ``until`` whatever it does; the launchers that exited (node -> code)."""
    while time.monotonic() < until and len(run.exited()) < len(run.nodes):
        time.sleep(0.1)
    return run.exited()


def _measured(run: Run, kind: str, window: float) -> tuple[FaultFigures, float]:
    """Deal fault ``kind`` and hold the run through ``window``: (figures, when the fault was dealt)."""
    _start(run)
    fault_at = _fault(run, kind)
    if fault_at is None:
        raise SystemFailed(f"{run.system}: no worker of node 1 to crash")
    _hold(run, fault_at + window + 0.5)
    return fault_figures(commits(run.events(0)), commits(run.events(1)), fault_at, window), fault_at


def measure_fault(run: Run, kind: str, window: float) -> tuple[FaultFigures, str]:
    figures, _ = _measured(run, kind, window)
    return figures, outcome(figures)


def measure_control_plane(run: Run, window: float, cluster=None) -> tuple[FaultFigures, str]:
    """A crash of node 1's worker, then at once the control plane: ``cluster``'s leader (an
    :class:`~support.etcd_cluster.EtcdCluster` the run uses) or else TorchFT's lighthouse.
    A launcher exiting after it is a result, not a failure.

    Raises:
        SystemFailed: the job did not reach the fault, or node 1 had no worker to crash.
        EtcdServerError: the cluster agreed on no leader before the fault.
    """
    _start(run)
    leader = cluster.leader() if cluster is not None else None  # asked first: the kill follows the crash at once
    fault_at = run.crash(1)
    if fault_at is None:
        raise SystemFailed(f"{run.system}: no worker of node 1 to crash")
    if leader is not None:
        killed_at = time.monotonic()
        cluster.kill(leader)
        what = f"etcd leader ({leader.name} of {len(cluster.members)})"
    else:
        killed_at = run.kill_lighthouse()
        what = "lighthouse"
    return _through_window(run, fault_at, window, f"{what} killed {1000 * (killed_at - fault_at):.1f} ms after the crash")


def measure_fault_and_state(run: Run, kind: str, window: float):
    """:func:`measure_fault`, plus what moving the state cost (``--state-mb``): (figures, state)."""
    figures, fault_at = _measured(run, kind, window)
    return figures, state_figures(run.events(0) + run.events(1), fault_at)


def measure_hsdp_fault(run: Run, kind: str, window: float):
    """:func:`measure_fault` for an HSDP run, plus how its state came back: (figures, heal).

    ``back_s`` counts node 1's commits from its first worker started after the fault: the crashed
    worker's partner can log a step it had all but committed just after the kill."""
    figures, fault_at = _measured(run, kind, window)
    events = run.events(1)
    restarted = min((e["t"] for e in events if e.get("ev") == "start" and e["t"] > fault_at), default=None)
    back = None if restarted is None else first_after(commits(events), restarted, fault_at + window)
    figures = replace(figures, back_s=None if back is None else back + restarted - fault_at)
    return figures, shard_heal_figures(run.events(0) + events, fault_at)


def measure_schedule(run: Run, seconds: float) -> ScheduleFigures:
    _start(run)
    began = time.monotonic()
    dealt = skipped = 0
    for index in range(int(seconds // SCHEDULE_EVERY_S)):
        _hold(run, began + index * SCHEDULE_EVERY_S)
        if _fault(run, SCHEDULE_FAULTS[index % 2]) is None:
            skipped += 1
        else:
            dealt += 1
    _hold(run, began + seconds)
    survivor = commits(run.events(0))
    useful, redone = useful_and_redone(survivor, began, began + seconds)
    return ScheduleFigures(useful, seconds / step_period(survivor, began), redone, dealt, skipped)


def _fmt(value, spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


WIDTH = max(len(label) for label in LABELS.values())
"""The system column's width: the longest label."""
KIND_WIDTH = max(len(kind) for kind in FAULTS)
"""The fault column's width: the longest fault's name."""


def fault_table(results: dict[tuple[str, str], object], systems: list[str], window: float,
                notes: dict[tuple[str, str], str] | None = None) -> str:
    """One line per fault and system: the figures, or the reason it has none; then its note."""
    lines = [f"{'fault':<{KIND_WIDTH}} {'system':<{WIDTH}} {'gap s':>6} {'redone':>6} {'back s':>7} "
             f"{'useful/undisturbed':>19} {'goodput':>7} {'gap vs torchrun':>15} {'goodput vs torchrun':>19}  notes"]
    for kind in FAULTS:
        reference = results.get((kind, "torchrun"))
        for system in systems:
            figures = results.get((kind, system))
            if figures is None:
                continue
            if isinstance(figures, str):
                lines.append(f"{kind:<{KIND_WIDTH}} {LABELS[system]:<{WIDTH}} {figures}")
                continue
            ref = reference if reference is not None and not isinstance(reference, str) else None
            gap_ratio = "n/a" if figures.stalled else ratio(figures.longest_gap_s, ref and ref.longest_gap_s)
            lines.append(f"{kind:<{KIND_WIDTH}} {LABELS[system]:<{WIDTH}} {gap_cell(figures):>6} "
                         f"{figures.steps_redone:>6} {back_cell(figures):>7} "
                         f"{f'{figures.useful}/{figures.undisturbed:.0f}':>19} {figures.goodput:>7.3f} {gap_ratio:>15} "
                         f"{ratio(figures.goodput, ref and ref.goodput):>19}  {(notes or {}).get((kind, system), '')}"
                         .rstrip())
    return f"faults at step {FAULT_STEP}; goodput over {window:g} s after the fault\n" + "\n".join(lines)


def state_table(states: dict[tuple[str, str], object], systems: list[str], state_mb: int) -> str:
    """The ``--state-mb`` columns, one row per fault and system as in :func:`fault_table`."""
    lines = [f"state: ~{state_mb} MiB of parameters + Adam (LIVE_BIG_MB={state_mb}); n/a: not this system's way",
             f"{'fault':<{KIND_WIDTH}} {'system':<{WIDTH}} {'state MB':>8} {'transfer s':>10} {'ckpt save s':>11} "
             f"{'reload s':>8} {'heal s':>6}"]
    for kind in FAULTS:
        for system in systems:
            figures = states.get((kind, system))
            if figures is None:
                continue
            size = _fmt(figures.state_bytes and figures.state_bytes / 1e6, ".1f")
            lines.append(f"{kind:<{KIND_WIDTH}} {LABELS[system]:<{WIDTH}} {size:>8} "
                         f"{_fmt(figures.transfer_s, '.3f'):>10} {_fmt(figures.save_s, '.3f'):>11} "
                         f"{_fmt(figures.reload_s, '.3f'):>8} {_fmt(figures.heal_s, '.3f'):>6}")
    return "\n".join(lines)


def heal_table(heals: dict[tuple[str, str], object], systems: list[str]) -> str:
    """``--hsdp``: per fault and system, how the state came back (:class:`HealFigures`)."""
    lines = ["heal: the ranks that took state in after the fault, the most bytes one took, the slowest one's "
             "seconds (live: shard heal from a live replica; torchrun: dcp.load of the newest sharded checkpoint; "
             "TorchFT: its Manager's heal)",
             f"{'fault':<{KIND_WIDTH}} {'system':<{WIDTH}} {'ranks':>5} {'bytes/rank':>10} {'heal s':>7}"]
    for kind in FAULTS:
        for system in systems:
            figures = heals.get((kind, system))
            if figures is not None:
                lines.append(f"{kind:<{KIND_WIDTH}} {LABELS[system]:<{WIDTH}} {figures.ranks:>5} "
                             f"{_fmt(figures.bytes_per_rank, 'd'):>10} {_fmt(figures.seconds, '.3f'):>7}")
    return "\n".join(lines)


def schedule_table(results: dict[str, object], systems: list[str], seconds: float) -> str:
    lines = [f"schedule: a fault every {SCHEDULE_EVERY_S:g} s for {seconds:g} s (crash, node loss, ...)",
             f"{'system':<{WIDTH}} {'useful/undisturbed':>19} {'fraction':>8} {'redone':>6} {'faults':>6}"]
    for system in systems:
        figures = results.get(system)
        if isinstance(figures, ScheduleFigures):
            lines.append(f"{LABELS[system]:<{WIDTH}} {f'{figures.useful}/{figures.undisturbed:.0f}':>19} "
                         f"{figures.fraction:>8.3f} {figures.redone:>6} {figures.faults:>6}"
                         + (f" ({figures.skipped} skipped: no worker running)" if figures.skipped else ""))
        elif figures is not None:
            lines.append(f"{LABELS[system]:<{WIDTH}} {figures}")
    return "\n".join(lines)


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(args) -> int:
    """Run the side-by-side mode with ``live_recovery.py``'s parsed arguments; 1 if a run failed.

    SIGINT and SIGTERM end it like Ctrl-C: every process it started is stopped on the way out.
    """
    signal.signal(signal.SIGINT, _interrupted)
    signal.signal(signal.SIGTERM, _interrupted)
    systems = list(args.systems)
    notes: dict[str, str] = {}
    python = None
    if "torchft" in systems:
        python, how = torchft_python(CACHE)
        if python is None:
            print(f"TorchFT not run: {how}")
            notes["torchft"] = f"not run: {how}"
            systems.remove("torchft")
    load_before = os.getloadavg()
    faults: dict[tuple[str, str], object] = {}
    row_notes: dict[tuple[str, str], str] = {}
    schedule: dict[str, object] = {}
    states: dict[tuple[str, str], object] = {}
    fault_runs: dict[tuple[str, str], list[tuple[FaultFigures, str, object]]] = {}
    schedule_runs: dict[str, list[ScheduleFigures]] = {}
    fault_errors: dict[tuple[str, str], list[str]] = {}
    schedule_errors: dict[str, list[str]] = {}
    state_mb = getattr(args, "state_mb", 0)
    hsdp = getattr(args, "hsdp", False)
    repetitions = getattr(args, "repetitions", 1)
    failed = 0
    with ExitStack() as cleanup:
        sys.path.insert(0, str(REPO))
        from elastic.testing.etcd_server import EtcdServerError, EtcdServerOptions, start_etcd_server
        from support.etcd_cluster import EtcdCluster

        server = start_etcd_server(EtcdServerOptions())
        cleanup.callback(server.close)
        workdir = Path(tempfile.mkdtemp(prefix="live-side-"))
        plan = [(kind, system) for kind in args.faults for system in systems]
        plan += [("schedule", system) for system in systems] if args.schedule else []
        # Repetitions go round the whole plan, so a change of load touches every system alike.
        for repetition, (kind, system) in ((r, step) for r in range(repetitions) for step in plan):
            if kind == "control_plane" and system == "torchrun":
                faults[kind, system] = NO_CONTROL_PLANE
                continue
            rundir = workdir / f"{kind}-{system}-{repetition}"
            rundir.mkdir()
            cluster = run = None
            try:
                endpoints = server.endpoints
                if kind == "control_plane" and system in ETCD_SYSTEMS:
                    cluster = EtcdCluster(ETCD_MEMBERS)
                    endpoints = cluster.endpoints()
                run = Run(system, rundir, endpoints, args.step_seconds, python, args.timeout,
                          rejoin_timeout=args.rejoin_timeout, state_mb=state_mb, start_sleep=start_sleep(kind),
                          hsdp=hsdp)
                note, state = "", None
                if kind == "schedule":
                    figures = measure_schedule(run, args.schedule)
                    schedule_runs.setdefault(system, []).append(figures)
                elif kind == "control_plane":
                    figures, note = measure_control_plane(run, args.window, cluster)
                elif kind == "freeze":
                    figures, note = measure_freeze(run, args.window)
                elif kind == "sigterm":
                    figures, note = measure_sigterm(run, args.window)
                elif hsdp:
                    figures, state = measure_hsdp_fault(run, kind, args.window)
                    note = outcome(figures)
                    print(f"  {kind:<{KIND_WIDTH}} {LABELS[system]:<{WIDTH}} {asdict(state)}", file=sys.stderr,
                          flush=True)
                elif state_mb:
                    figures, state = measure_fault_and_state(run, kind, args.window)
                    note = outcome(figures)
                    print(f"  {kind:<{KIND_WIDTH}} {LABELS[system]:<{WIDTH}} {asdict(state)}", file=sys.stderr,
                          flush=True)
                else:
                    figures, note = measure_fault(run, kind, args.window)
                if kind != "schedule":
                    fault_runs.setdefault((kind, system), []).append((figures, note, state))
                print(f"  {kind:<{KIND_WIDTH}} {LABELS[system]:<{WIDTH}} {asdict(figures)} {note}", file=sys.stderr,
                      flush=True)
            except (SystemFailed, ValueError, EtcdServerError) as error:
                failed += 1
                if kind == "schedule":
                    schedule_errors.setdefault(system, []).append(str(error))
                else:
                    fault_errors.setdefault((kind, system), []).append(str(error))
                print(f"  {kind:<{KIND_WIDTH}} {LABELS[system]:<{WIDTH}} FAILED: {error}", file=sys.stderr, flush=True)
            finally:
                if run is not None:
                    run.stop()
                if cluster is not None:
                    cluster.close()
    for key, runs in fault_runs.items():
        figures, note, state = runs[median_run([each.longest_gap_s for each, _, _ in runs])]
        lost = fault_errors.pop(key, [])
        faults[key] = figures
        parts = (note, gap_note(figures), spread_note([each for each, _, _ in runs]),
                 heal_spread_note([heal for _, _, heal in runs]) if hsdp else "",
                 f"{len(lost)} run(s) failed" if lost else "")
        row_notes[key] = "; ".join(part for part in parts if part)
        if state is not None:
            states[key] = state
    schedule_notes = {}
    for system, runs in schedule_runs.items():
        schedule[system] = runs[median_run([-each.fraction for each in runs])]
        fractions = sorted(each.fraction for each in runs)
        lost = schedule_errors.pop(system, [])
        if len(runs) > 1 or lost:
            schedule_notes[system] = (f"median of {len(runs)} runs: fraction {fractions[0]:.3f}-{fractions[-1]:.3f}"
                                      + (f"; {len(lost)} run(s) failed" if lost else ""))
    # What is left failed in every repetition.
    faults.update({key: f"FAILED: {lost[0]}" for key, lost in fault_errors.items()})
    schedule.update({system: f"FAILED: {lost[0]}" for system, lost in schedule_errors.items()})
    load_after = os.getloadavg()
    print(f"load average (1/5/15 min) before {tuple(round(x, 2) for x in load_before)}, "
          f"after {tuple(round(x, 2) for x in load_after)} on {os.cpu_count()} CPUs; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for system, note in notes.items():
        print(f"{LABELS[system]}: {note}")
    if faults:
        print(fault_table(faults, systems, args.window, row_notes))
    if states:
        print(heal_table(states, systems) if hsdp else state_table(states, systems, state_mb))
    if schedule:
        print(schedule_table(schedule, systems, args.schedule))
        for system, note in schedule_notes.items():
            print(f"  {LABELS[system]}: {note}")
    if failed:
        print(f"{failed} run(s) failed; worker and launcher logs kept in {workdir}", file=sys.stderr)
    elif getattr(args, "keep_logs", False):
        print(f"worker and launcher logs kept in {workdir}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0
