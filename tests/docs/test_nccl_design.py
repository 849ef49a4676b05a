"""The one line a live worker refuses NCCL with points at a section of docs/live-recovery.md that
exists and covers what the refusal leaves the reader to know."""

from __future__ import annotations

from pathlib import Path

from elastic.worker.backend import NCCL_DESIGN, NCCL_OPT_IN
from test_links import anchors

REPO = Path(__file__).resolve().parents[2]

COVERED = [
    NCCL_OPT_IN,  # the way in, and what it takes as it is
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",  # which mode keeps a survivor alive
    "TORCH_NCCL_BLOCKING_WAIT",  # and why blocking wait is no substitute
    "ncclCommAbort",  # how a survivor's in-flight collective ends
    "get_future_result()",  # what the guard would wait on
    "device_id",  # a communicator per generation, eagerly
    "Cannot re-initialize CUDA in forked subprocess",  # why no pre-forked CUDA context
    "must not wait for a replacement",  # and why that matters most on GPUs
    "wire device",  # the heal's transfer
    "To verify on real GPUs",  # the checklist
]


def section(path: Path, heading: str) -> str:
    """The text of ``heading``'s section in ``path``, up to the next heading of its level or above."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = lines.index(heading)
    level = heading.split(" ", 1)[0]
    end = next((i for i in range(start + 1, len(lines))
                if lines[i].startswith("#") and len(lines[i].split(" ", 1)[0]) <= len(level)), len(lines))
    return "\n".join(lines[start:end])


def test_the_nccl_refusal_points_at_a_section_that_exists():
    page, _, anchor = NCCL_DESIGN.partition("#")
    assert anchor in anchors(REPO / page)


def test_the_nccl_design_covers_what_the_refusal_leaves_to_it():
    text = section(REPO / "docs" / "live-recovery.md", "## NCCL: the design")
    assert [term for term in COVERED if term not in text] == []
