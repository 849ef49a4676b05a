"""The quick start's install line brings what the workers need to start quietly.

torch imports numpy in every worker and warns ``Failed to initialize NumPy: No module named
'numpy'`` (twice in the quick start, once per worker) when it is missing, and torch does not
declare it. ``pip install -e .`` must therefore install numpy: pip resolves the README's install
line for real (``--dry-run``, ignoring what this environment has) and its report must list it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # pip builds the package's metadata and resolves every dependency


def test_pip_install_of_the_checkout_installs_numpy(tmp_path):
    report = tmp_path / "report.json"
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                             "--report", str(report), "-e", str(REPO)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    installed = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert {"etcd-elastic", "numpy"} <= installed, sorted(installed)
