"""Works completed by hand and a settable clock, for the registry and fence tests (torch futures)."""

from __future__ import annotations

import torch


class FutureWork:
    """A work with a future (like a gloo collective); the test completes ``future``."""

    def __init__(self) -> None:
        self.future = torch.futures.Future()

    def get_future(self):
        return self.future

    def is_completed(self) -> bool:
        return self.future.done()


class Clock:
    """Monotonic seconds that move only when a test sets ``now``."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now
