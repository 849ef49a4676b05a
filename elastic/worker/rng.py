"""The random number generators of a live worker, derived rather than carried.

A joiner must draw what the rank it replaces would have drawn, and a step run again must draw
what its failed attempt drew. Shipping a survivor's generator state to a joiner does neither
(rank r's state given to rank s makes their dropout masks identical), so the library seeds the
global generators at the start of every attempt from ``(seed, step, live rank)``
(:func:`step_seed`), and each sample an :class:`~elastic.worker.data.ElasticLoader` loads from
``(data seed, epoch, index)`` (:func:`sample_seed`): what the generators hold is then fully
determined by what a heal carries (the seed, the step, the data position).

Seeded: torch's CPU generator (and every CUDA device's, for a step), Python's ``random``, and
numpy's global generator when numpy is imported. Generators a program creates itself
(``torch.Generator``, ``numpy.random.default_rng``) are its own: seed them from
``StepAttempt.seed``, or register them as state.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import sys
from typing import Iterator

import torch

__all__ = ["derive_seed", "preserved_rngs", "sample_seed", "seed_generators", "step_seed"]

_MASK64 = (1 << 64) - 1


def derive_seed(*parts: int | str) -> int:
    """A 64-bit seed from ``parts`` (integers of any size, and strings naming the use): equal
    parts give equal seeds in every process and Python version; any change gives another."""
    text = ",".join(f"{type(part).__name__[0]}{part}" for part in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def step_seed(seed: int, step: int, rank: int) -> int:
    """The seed of every attempt of step ``step`` on live rank ``rank``."""
    return derive_seed("step", seed, step, rank)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of dataset index ``index`` in epoch ``epoch`` of a data order drawn from ``seed``:
    the same whichever rank, world, worker process or attempt loads it."""
    return derive_seed("sample", seed, epoch, index)


def seed_generators(seed: int, devices: bool = True) -> None:
    """Seed torch's CPU generator (and, with ``devices``, every CUDA device's once CUDA is
    initialised), ``random``, and numpy's global generator if numpy is imported, from one 64-bit
    ``seed``."""
    seed &= _MASK64
    torch.default_generator.manual_seed(seed)
    if devices and torch.cuda.is_initialized():  # before, torch would queue it with a stack trace (0.3 ms)
        torch.cuda.manual_seed_all(seed)
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed((seed ^ (seed >> 32)) & 0xFFFFFFFF)


@contextlib.contextmanager
def preserved_rngs() -> Iterator[None]:
    """Restore torch's CPU generator, ``random`` and numpy's global generator (if imported) on exit."""
    numpy = sys.modules.get("numpy")
    saved = (torch.get_rng_state(), random.getstate(), None if numpy is None else numpy.random.get_state())
    try:
        yield
    finally:
        torch.set_rng_state(saved[0])
        random.setstate(saved[1])
        if saved[2] is not None:
            numpy.random.set_state(saved[2])
