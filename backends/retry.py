"""Retries as policy objects: how often and how long to retry an idempotent step."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar

from backends.errors import BackendConnectionError, BackendTimeoutError

T = TypeVar("T")

RETRYABLE_ERRORS: tuple[type[BaseException], ...] = (BackendConnectionError, BackendTimeoutError)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter, bounded by attempts and by a total monotonic deadline.

    Only idempotent steps may be retried. ``sleep`` and ``clock`` are injectable for tests.

    Attributes:
        max_attempts: attempts in all, including the first (>= 1).
        initial_backoff: first sleep, seconds.
        max_backoff: cap on one sleep, seconds.
        multiplier: growth of the sleep per attempt.
        total_timeout: give up once this many seconds have passed since the first attempt (None: no limit).
    """

    max_attempts: int = 5
    initial_backoff: float = 0.05
    max_backoff: float = 1.0
    multiplier: float = 2.0
    total_timeout: float | None = None
    jitter: float = 0.2
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"The retry policy's max_attempts ({self.max_attempts}) must be at least 1.")
        if self.initial_backoff < 0 or self.max_backoff < 0:
            raise ValueError("The retry policy's backoffs must not be negative.")
        if self.total_timeout is not None and self.total_timeout <= 0:
            raise ValueError(f"The retry policy's total_timeout ({self.total_timeout}) must be positive.")

    def backoff(self, attempt: int) -> float:
        """Sleep before retry number ``attempt`` (1 = first retry), jittered."""
        base = min(self.max_backoff, self.initial_backoff * self.multiplier ** (attempt - 1))
        return base * (1 + self.jitter * (2 * random.random() - 1))

    def run(
        self,
        step: Callable[[], T],
        retry_on: tuple[type[BaseException], ...] = RETRYABLE_ERRORS,
        on_retry: Callable[[int, BaseException], None] | None = None,
    ) -> T:
        """Run ``step`` until it succeeds or the policy is exhausted; re-raises the last error."""
        start = self.clock()
        attempt = 0
        while True:
            attempt += 1
            try:
                return step()
            except retry_on as error:
                if attempt >= self.max_attempts:
                    raise
                pause = self.backoff(attempt)
                if self.total_timeout is not None and self.clock() + pause - start > self.total_timeout:
                    raise
                if on_retry is not None:
                    on_retry(attempt, error)
                self.sleep(pause)


NO_RETRY = RetryPolicy(max_attempts=1)
