"""Fixtures of the Helm chart tests: a real helm v3 (the tests fail, never skip, without one)."""

from __future__ import annotations

import pytest

from chartlib import HELM_MAJOR, INSTALL_HINT, Manifests, PROFILES, find_helm, helm_version, render


@pytest.fixture(scope="session")
def helm() -> str:
    """Path of a helm v3 binary ($HELM or on PATH). Fails the test when there is none."""
    path = find_helm()
    if path is None:
        pytest.fail(f"The chart tests need helm v3 and none was found ($HELM or on PATH): {INSTALL_HINT}.",
                    pytrace=False)
    version = helm_version(path)
    if not version.startswith(HELM_MAJOR):
        pytest.fail(f"The chart tests need helm v3; {path} is {version}: {INSTALL_HINT}.", pytrace=False)
    return path


@pytest.fixture(scope="session")
def rendered(helm: str) -> dict[str | None, Manifests]:
    """Every value profile rendered once (None: the chart's defaults)."""
    return {profile: render(helm, profile) for profile in (None, *PROFILES)}
