"""The side-by-side live-recovery benchmark's figures, from the step events workers log.

Pure functions over :class:`Commit` lists (a worker's committed steps with its own
``time.monotonic()`` stamps; one clock for the machine), so they are tested without a launcher
(``tests/benchmarks/test_live_figures.py``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence


@dataclass(frozen=True)
class Commit:
    """One committed training step: its number and when the worker committed it."""

    step: int
    t: float


@dataclass(frozen=True)
class FaultFigures:
    """What one fault cost, seen from the survivor (and the failed node for ``back_s``).

    ``back_s`` is None when the failed node committed no step within the window; ``useful`` counts
    the survivor's commits in the window that advanced the training (a redone step does not).
    ``stalled``: the survivor was not committing at the window's end, and that stretch is its
    longest gap (so ``longest_gap_s`` is a lower bound: the gap had not ended).
    """

    longest_gap_s: float
    steps_redone: int
    back_s: float | None
    useful: int
    undisturbed: float
    stalled: bool = False
    gap_from_s: float | None = None
    """When the longest gap began, in seconds from the fault (negative: at the last commit before
    it); None when not computed."""

    @property
    def goodput(self) -> float:
        return self.useful / self.undisturbed if self.undisturbed else float("nan")


def commits(events: Iterable[dict]) -> list[Commit]:
    """The ``{"ev": "step", "step": N, "t": T}`` events of a worker log, in time order."""
    return sorted((Commit(e["step"], e["t"]) for e in events if e.get("ev") == "step"), key=lambda c: c.t)


def step_period(done: Sequence[Commit], before: float, last: int = 15) -> float:
    """The median time between the last ``last`` commits before ``before`` (the undisturbed rate).

    Raises:
        ValueError: fewer than two commits before ``before``.
    """
    times = [c.t for c in done if c.t <= before][-(last + 1):]
    if len(times) < 2:
        raise ValueError(f"{len(times)} step(s) committed before the fault: no undisturbed rate")
    return statistics.median(b - a for a, b in zip(times, times[1:]))


def longest_gap(done: Sequence[Commit], start: float, end: float) -> float:
    """The longest time without a commit in [start, end]: between two commits, or from the last
    commit before ``start`` to the first after it, or to ``end`` when nothing followed."""
    return _longest(done, start, end)[0]


def longest_gap_began(done: Sequence[Commit], start: float, end: float) -> float:
    """When :func:`longest_gap`'s gap began (a commit's time, or ``start`` with none before it);
    of equal gaps, the first."""
    return _longest(done, start, end)[1]


def _longest(done: Sequence[Commit], start: float, end: float) -> tuple[float, float]:
    times = [c.t for c in done]
    before = [t for t in times if t <= start]
    inside = [t for t in times if start < t <= end]
    points = ([before[-1]] if before else [start]) + inside + [end]
    return max(((b - a, a) for a, b in zip(points, points[1:])), key=lambda gap: gap[0])


def useful_and_redone(done: Sequence[Commit], start: float, end: float) -> tuple[int, int]:
    """Commits in (start, end] that advanced the step count, and those that repeated a step
    already committed (a restart from a checkpoint)."""
    high = max((c.step for c in done if c.t <= start), default=-1)
    useful = redone = 0
    for commit in done:
        if commit.t <= start:
            continue
        if commit.t > end:
            break
        if commit.step > high:
            useful += 1
            high = commit.step
        else:
            redone += 1
    return useful, redone


def first_after(done: Sequence[Commit], moment: float, end: float) -> float | None:
    """Seconds from ``moment`` to the first commit after it, if one came by ``end``."""
    return next((c.t - moment for c in done if moment < c.t <= end), None)


def stalled_at_end(done: Sequence[Commit], start: float, end: float, period: float) -> bool:
    """Whether the time from the last commit (by ``end``) to ``end`` is the longest gap in
    [start, end] and longer than two step periods: the survivor had stopped, not paused."""
    trailing = end - max((c.t for c in done if c.t <= end), default=start)
    return trailing > 2 * period and trailing >= longest_gap(done, start, end)


def fault_figures(survivor: Sequence[Commit], failed: Sequence[Commit], fault_at: float, window: float) -> FaultFigures:
    """One fault's figures over ``window`` seconds after ``fault_at``.

    Raises:
        ValueError: the survivor committed too few steps before the fault to have a rate.
    """
    end = fault_at + window
    period = step_period(survivor, fault_at)
    useful, redone = useful_and_redone(survivor, fault_at, end)
    gap, began = _longest(survivor, fault_at, end)
    return FaultFigures(longest_gap_s=gap, steps_redone=redone,
                        back_s=first_after(failed, fault_at, end), useful=useful, undisturbed=window / period,
                        stalled=stalled_at_end(survivor, fault_at, end, period), gap_from_s=began - fault_at)


def gap_note(figures: FaultFigures, after: float = 1.0) -> str:
    """When the survivor's longest gap began, if more than ``after`` seconds after the fault (not
    the fault's own gap: a late joiner's, say); empty otherwise."""
    if figures.gap_from_s is None or figures.gap_from_s <= after or figures.stalled:
        return ""
    return f"longest gap began {figures.gap_from_s:.2f} s after the fault"


def gap_cell(figures: FaultFigures) -> str:
    """The survivor's longest gap for a table: ``>59.9`` when it had not ended by the window's end."""
    return f">{figures.longest_gap_s:.1f}" if figures.stalled else f"{figures.longest_gap_s:.2f}"


def back_cell(figures: FaultFigures) -> str:
    """Seconds until the failed node committed again, or ``never`` (within the window)."""
    return "never" if figures.back_s is None else f"{figures.back_s:.2f}"


def outcome(figures: FaultFigures, exits: Mapping[int, int] | None = None) -> str:
    """What a reader must know beyond the figures: a survivor that stopped committing (and never
    resumed, or resumed and stopped again), a failed node that never came back, launchers that
    exited (node -> exit code). Empty for a recovered run."""
    notes = []
    if figures.stalled:
        notes.append("survivor never committed after the fault" if figures.useful + figures.steps_redone == 0
                     else "survivor stopped committing and had not resumed at the window's end")
    if figures.back_s is None:
        notes.append("node 1 never committed again")
    notes += [f"node {node}'s launcher exited {code}" for node, code in sorted((exits or {}).items())]
    return "; ".join(notes)


def ratio(value: float | None, reference: float | None) -> str:
    """``value / reference`` as ``1.23x``, or ``n/a`` when either is missing or the reference 0."""
    if value is None or reference is None or reference == 0 or value != value or reference != reference:
        return "n/a"
    return f"{value / reference:.2f}x"


@dataclass(frozen=True)
class StateFigures:
    """What moving the training state cost in one fault's run (``--state-mb``); None: not seen.

    ``transfer_s``: the replacement's heal from a live peer (a live system's ``recovery`` record
    as receiver, ``healed - formed``); ``save_s``: the median checkpoint save; ``reload_s``: the
    slowest rank's checkpoint load after the fault (the group waits for it); ``heal_s``: TorchFT's
    heal of the replacement (its fetch plus our ``load_state_dict``).
    """

    state_bytes: int | None
    transfer_s: float | None
    transfer_bytes: int | None
    save_s: float | None
    reload_s: float | None
    heal_s: float | None


def state_figures(events: Iterable[dict], fault_at: float) -> StateFigures:
    """The state figures from both nodes' worker events (``state``, ``recovery``, ``saved``,
    ``loaded`` and ``heal``); only the heals and loads after ``fault_at`` count."""
    events = list(events)
    sizes = [e["nbytes"] for e in events if e.get("ev") == "state"]
    received = sorted((e for e in events if e.get("ev") == "recovery" and e.get("role") == "receiver"
                       and e["formed"] > fault_at), key=lambda e: e["formed"])
    saves = [e["save_s"] for e in events if e.get("ev") == "saved"]
    loads = [e["load_s"] for e in events if e.get("ev") == "loaded" and e["t"] > fault_at]
    heals = sorted((e for e in events if e.get("ev") == "heal" and e["t"] > fault_at), key=lambda e: e["t"])
    heal = heals[0] if heals else None
    return StateFigures(
        state_bytes=max(sizes) if sizes else None,
        transfer_s=received[0]["healed"] - received[0]["formed"] if received else None,
        transfer_bytes=received[0]["nbytes"] if received else None,
        save_s=statistics.median(saves) if saves else None,
        reload_s=max(loads) if loads else None,
        heal_s=heal["fetch_s"] + heal["load_s"] if heal and heal.get("fetch_s") is not None else None)


@dataclass(frozen=True)
class HealFigures:
    """How an HSDP run moved its state back after a fault (``--hsdp``); None: not seen.

    ``ranks``: the ranks that took state in (a live heal's receivers, a checkpoint reload's
    ranks, TorchFT's healed ranks); ``bytes_per_rank``: the most one of them took in (its own
    shard of parameters and optimizer state); ``seconds``: the slowest of them (a live heal's
    ``healed - formed``, a reload's ``dcp.load`` and ``set_state_dict``, TorchFT's fetch and
    load), as the ranks take theirs in parallel.
    """

    ranks: int
    bytes_per_rank: int | None
    seconds: float | None


def shard_heal_figures(events: Iterable[dict], fault_at: float) -> HealFigures:
    """The heal figures from both nodes' worker events after ``fault_at``: ``recovery`` records
    as receiver, ``loaded`` (with ``bytes``) or ``heal`` events, whichever the system wrote."""
    events = [e for e in events if e.get("t", 0.0) > fault_at]
    received = [(e["nbytes"], e["healed"] - e["formed"]) for e in events
                if e.get("ev") == "recovery" and e.get("role") == "receiver"]
    loaded = [(e.get("bytes"), e["load_s"]) for e in events if e.get("ev") == "loaded"]
    healed = [(e["nbytes"], (e.get("fetch_s") or 0.0) + e["load_s"]) for e in events if e.get("ev") == "heal"]
    taken = received or loaded or healed
    if not taken:
        return HealFigures(0, None, None)
    sizes = [size for size, _ in taken if size is not None]
    return HealFigures(len(taken), max(sizes) if sizes else None, max(seconds for _, seconds in taken))
