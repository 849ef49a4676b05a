"""Fixtures of the Helm chart tests: a real helm v3 (the tests fail, never skip, without one)."""

from __future__ import annotations

import pytest

from chartlib import PROFILES, Manifests, helm_or_fail, render


@pytest.fixture(scope="session")
def helm() -> str:
    """A helm v3 binary (see :func:`chartlib.helm_or_fail`); the tests fail, never skip, without one."""
    return helm_or_fail()


@pytest.fixture(scope="session")
def rendered(helm: str) -> dict[str | None, Manifests]:
    """Every value profile rendered once (None: the chart's defaults)."""
    return {profile: render(helm, profile) for profile in (None, *PROFILES)}
