"""The README's example of a flag abbreviation is one that elasticrun takes.

"Coming from torchrun" names an abbreviation argparse accepts; it is run for real (``--dry-run``)
and must resolve to the flag it abbreviates, where ``--nproc=2`` was refused as ambiguous.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from elastic.testing.agents import clean_env

REPO = Path(__file__).resolve().parents[2]


def readme_abbreviation() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    found = re.search(r"unambiguous abbreviations \(`([^`]+)`", text)
    assert found, "the README no longer gives an abbreviation example"
    return found.group(1)


def test_the_readme_abbreviation_example_is_accepted_and_sets_the_flag(tmp_path):
    example = readme_abbreviation()
    flag, _, value = example.partition("=")
    assert flag.startswith("--") and value, example
    result = subprocess.run([sys.executable, "-m", "elastic.run", "--standalone", example, "--dry-run", "train.py"],
                            cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    described = dict(re.findall(r"^(\w+):\s+(.*)$", result.stdout, re.M))
    [name] = [name for name in described if "--" + name.replace("_", "-") != flag
              and ("--" + name.replace("_", "-")).startswith(flag)]
    assert described[name].split()[0] == value, result.stdout
