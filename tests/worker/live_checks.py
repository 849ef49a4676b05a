"""Checks on the event logs of ``workers/live_train.py`` runs, shared by the live-recovery tests."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Iterable

sys.path.insert(0, str(Path(__file__).parent / "workers"))
from live_model import reference_losses  # noqa: E402

WORKER = Path(__file__).parent / "workers" / "live_train.py"
REPO = Path(__file__).resolve().parents[2]

# Short timeouts so the abandoned groups of a frozen peer end within the test.
TEST_OPTIONS = (
    '{"collective_timeout": 5, "store_timeout": 5, "form_timeout": 30, "round_wait_timeout": 30, '
    '"interrupt_grace": 0.5, "drain_timeout": 10}'
)


def worker_env(steps: int, step_sleep: float = 0.05, options: str = TEST_OPTIONS, **extra: str) -> dict[str, str]:
    return {"PYTHONPATH": str(REPO), "LIVE_STEPS": str(steps), "LIVE_STEP_SLEEP": str(step_sleep),
            "LIVE_OPTIONS": options, "OMP_NUM_THREADS": "1", **extra}


def steps(events: Iterable[dict]) -> list[dict]:
    return [event for event in events if event.get("ev") == "step"]


def recoveries(events: Iterable[dict]) -> list[dict]:
    return [event for event in events if event.get("ev") == "recovery"]


def last_step(events: Iterable[dict]) -> int:
    done = steps(events)
    return done[-1]["step"] if done else -1


def assert_no_redo(events: list[dict], first: int = 0) -> None:
    """A worker committed each step once, in order, from ``first``: it redid none."""
    numbers = [event["step"] for event in steps(events)]
    assert numbers == list(range(first, first + len(numbers))), f"steps not consecutive from {first}: {numbers}"


def assert_each_step_once(events: list[dict]) -> None:
    """A worker committed each step once, in order; it skipped steps only where a heal brought
    it forward (a generation formed without it, its peers trained on, and it received their state)."""
    healed = [(r["healed"], r["step"]) for r in recoveries(events) if r["role"] == "receiver"]
    done = steps(events)
    for before, after in zip(done, done[1:]):
        if after["step"] != before["step"] + 1:
            assert after["step"] > before["step"] and any(
                before["t"] < at <= after["t"] and step == after["step"] for at, step in healed), (
                f"step {after['step']} follows step {before['step']} without a heal to it")


def assert_consistent(logs: dict[str, list[dict]]) -> dict[int, dict]:
    """Every rank had the same parameters at the start of every step (the all-reduced checksum
    said so), and every worker that committed step s logged the same loss and checksum for it.
    Returns one step event per step number."""
    by_step: dict[int, dict] = {}
    for slot, events in logs.items():
        for event in steps(events):
            assert event["equal"] is True, f"{slot} step {event['step']}: ranks had different parameters"
            seen = by_step.setdefault(event["step"], event)
            assert (seen["sum"], seen["loss"]) == (event["sum"], event["loss"]), (
                f"step {event['step']}: {slot} logged sum {event['sum']} loss {event['loss']}, "
                f"another worker sum {seen['sum']} loss {seen['loss']}")
    return by_step


def assert_follows_reference(by_step: dict[int, dict], total: int) -> None:
    """The loss curve equals the undisturbed run's up to float rounding (the data split makes the
    averaged gradient independent of the world size)."""
    assert sorted(by_step) == list(range(total)), f"missing steps: {sorted(set(range(total)) - set(by_step))}"
    reference = reference_losses(total)
    for step, expected in enumerate(reference):
        got = by_step[step]["loss"]
        assert math.isclose(got, expected, rel_tol=1e-4, abs_tol=1e-6), f"step {step}: loss {got}, undisturbed {expected}"


def first_step_after(events: list[dict], moment: float) -> dict:
    return next(event for event in steps(events) if event["t"] > moment)


def gap_after(events: list[dict], moment: float) -> float:
    """Seconds from ``moment`` (a round's arrival) to the first step committed after it."""
    return first_step_after(events, moment)["t"] - moment


def longest_gap(events: list[dict]) -> float:
    times = [event["t"] for event in steps(events)]
    return max((b - a for a, b in zip(times, times[1:])), default=0.0)
