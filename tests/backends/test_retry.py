"""RetryPolicy: retries only what it should, as often and as long as configured."""

import pytest

from backends.errors import BackendAuthError, BackendConnectionError
from backends.retry import RetryPolicy


class FakeTime:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds

    def clock(self):
        return self.now


def flaky(failures, error=BackendConnectionError):
    calls = []

    def step():
        calls.append(1)
        if len(calls) <= failures:
            raise error("down")
        return "ok"

    return step, calls


def test_a_step_that_recovers_is_retried_until_it_succeeds():
    time = FakeTime()
    policy = RetryPolicy(max_attempts=5, initial_backoff=0.1, jitter=0, sleep=time.sleep, clock=time.clock)
    step, calls = flaky(3)
    assert policy.run(step) == "ok"
    assert len(calls) == 4
    assert time.sleeps == [0.1, 0.2, 0.4]


def test_the_last_error_is_raised_when_attempts_run_out():
    time = FakeTime()
    policy = RetryPolicy(max_attempts=3, sleep=time.sleep, clock=time.clock)
    step, calls = flaky(10)
    with pytest.raises(BackendConnectionError):
        policy.run(step)
    assert len(calls) == 3


def test_the_total_timeout_stops_retries_before_the_attempts_run_out():
    time = FakeTime()
    policy = RetryPolicy(max_attempts=100, initial_backoff=1, max_backoff=1, jitter=0,
                         total_timeout=2.5, sleep=time.sleep, clock=time.clock)
    step, calls = flaky(100)
    with pytest.raises(BackendConnectionError):
        policy.run(step)
    assert len(calls) == 3 and time.now <= 2.5


def test_errors_that_are_not_transient_are_not_retried():
    time = FakeTime()
    step, calls = flaky(1, BackendAuthError)
    with pytest.raises(BackendAuthError):
        RetryPolicy(sleep=time.sleep, clock=time.clock).run(step)
    assert len(calls) == 1 and time.sleeps == []


def test_backoff_is_capped():
    policy = RetryPolicy(initial_backoff=0.5, max_backoff=2, jitter=0)
    assert [policy.backoff(n) for n in (1, 2, 3, 4)] == [0.5, 1, 2, 2]


@pytest.mark.parametrize("kwargs", [{"max_attempts": 0}, {"initial_backoff": -1}, {"total_timeout": 0}])
def test_nonsense_settings_are_rejected(kwargs):
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)
