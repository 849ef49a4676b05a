"""The console of tee'd worker lines, elasticrun beside stock torchrun: same prefix, same lines.

Both launchers run one node of two workers with ``--redirects=3 --tee=3`` (every stream to its
log file and, prefixed, to the console) under ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``, which
torch substitutes with ``string.Template.safe_substitute`` (``${role_name}``, ``${rank}``,
``${local_rank}``). The workers' lines on each console must be the same, prefix included.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

WORKER = """
import os, sys
rank = os.environ["RANK"]
print(f"creating model on rank {rank}", flush=True)
print(f"warning from local rank {os.environ['LOCAL_RANK']}", file=sys.stderr, flush=True)
"""
MARKERS = ("creating model", "warning from")

LAUNCHERS = {
    "elasticrun": [sys.executable, "-m", "elastic.run"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
}


def console(launcher: str, tmp_path: Path, template: str | None) -> tuple[list[str], list[str]]:
    """The workers' lines on the launcher's stdout and stderr, sorted (ranks interleave freely)."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PET_", "TORCHELASTIC_", "OMP_"))}
    if template is not None:
        env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = template
    argv = [*LAUNCHERS[launcher], "--nproc-per-node=2", "--redirects=3", "--tee=3",
            f"--log-dir={tmp_path / launcher}", str(script)]
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert result.returncode == 0, result.stderr

    def workers(text: str) -> list[str]:
        return sorted(line for line in text.splitlines() if any(marker in line for marker in MARKERS))

    return workers(result.stdout), workers(result.stderr)


@pytest.mark.parametrize("template", [
    "[rank${rank}]:",
    "${role_name}/${local_rank}|${rank} ",
    "[${rank}${unknown}$$",  # names torch does not know, and a $$, stay as torch leaves them
    "",  # empty counts as unset: torch's [default0]:
    None,
])
def test_tee_lines_on_the_console_match_torchruns(tmp_path, template):
    ours = console("elasticrun", tmp_path, template)
    theirs = console("torchrun", tmp_path, template)
    assert ours == theirs
    assert len(ours[0]) == len(ours[1]) == 2


def test_the_issues_template_prints_rank_prefixes(tmp_path):
    out, err = console("elasticrun", tmp_path, "[rank${rank}]:")
    assert out == ["[rank0]:creating model on rank 0", "[rank1]:creating model on rank 1"]
    assert err == ["[rank0]:warning from local rank 0", "[rank1]:warning from local rank 1"]
