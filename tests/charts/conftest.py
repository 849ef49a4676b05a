"""Fixtures of the Helm chart tests: a real helm v3 (the tests fail, never skip, without one)."""

from __future__ import annotations

import pytest

from chartlib import HELM_MAJOR, INSTALL_HINT, Manifests, PROFILES, find_helm, helm_version, render
from elastic.testing.helm import HELM_VERSION, HelmInstallError, cache_dir, ensure_helm


@pytest.fixture(scope="session")
def helm() -> str:
    """Path of a helm v3 binary: $HELM, a v3 helm on PATH, or the pinned helm installed on first
    use into the user's cache (elastic.testing.helm). Fails the tests with one line when none."""
    path = find_helm()
    if path is not None:
        version = helm_version(path)
        if version.startswith(HELM_MAJOR):
            return path
        print(f"{path} is helm {version}; using the pinned helm {HELM_VERSION} instead")
    try:
        return str(ensure_helm())
    except HelmInstallError as error:
        pytest.fail(f"The chart tests need helm v3 and could not install the pinned {HELM_VERSION} into "
                    f"{cache_dir()}: {error}. {INSTALL_HINT}.", pytrace=False)


@pytest.fixture(scope="session")
def rendered(helm: str) -> dict[str | None, Manifests]:
    """Every value profile rendered once (None: the chart's defaults)."""
    return {profile: render(helm, profile) for profile in (None, *PROFILES)}
