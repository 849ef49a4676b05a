"""Issue 34, item 4: a live-recovery heal source costs a receiver no more than what it sends.

Any live rank can be the source (the highest mark wins). Each case runs a real gloo pair on
loopback (``heal_peer.py``): rank 0 sends a hostile header, or a real state, and rank 1
receives it through :func:`elastic.worker.transfer.receive_state`. On main, 250 overlapping
tensors of an 8 KB header were cloned into 999 MiB; a shape of 600,000 dimensions held the GIL
for seconds; a chunk of 10^15 or 10^30 elements escaped as ``RuntimeError``/``TypeError``; a
header of a million empty chunks took a gigabyte and two minutes. Each is now one
:class:`StateTransferError` naming the bound. (What each costs, before and after:
``python benchmarks/heal_hostile.py``.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hostile import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from heal_hostile import run_case  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.needs_torch]  # each case starts two torch processes


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("overlap", "tensors that overlap in chunk 0 at element 1"),
        ("long_shape", "bad shape"),
        ("chunk_1e15", "announced a state of 4000000000000000 bytes; cpu has .* bytes available"),
        ("chunk_1e30", "bad chunk"),
        ("many_chunks", "more than 12 empty chunks"),
    ],
)
def test_a_hostile_state_header_is_one_state_transfer_error(case, message):
    import re

    (result,) = run_case(case, Path(REPO), 0, timeout=240)
    assert result["outcome"] == "StateTransferError" and re.search(message, result["error"]), result
    assert result["rss_peak_mib"] < 512, result  # main: +1011 MiB for "overlap", +1079 MiB for "many_chunks"


def test_a_state_over_max_state_bytes_is_refused_and_one_under_it_arrives_whole():
    (refused,) = run_case("legit", Path(REPO), 8, rounds=1, max_state_bytes=4 << 20, timeout=240)
    assert refused["outcome"] == "StateTransferError", refused
    assert "announced a state of 8593408 bytes; the limit is 4194304 bytes (LiveOptions.max_state_bytes)" in refused["error"]
    (received,) = run_case("legit", Path(REPO), 8, rounds=1, max_state_bytes=16 << 20, timeout=240)
    assert received["outcome"] == "ok" and received["nbytes"] > 8 << 20, received


def test_a_chunk_that_cannot_be_allocated_under_a_generous_limit_is_a_state_transfer_error():
    (result,) = run_case("chunk_1e15", Path(REPO), 0, max_state_bytes=2**62, timeout=240)
    assert result["outcome"] == "StateTransferError", result
    assert "rank 0's state: cannot allocate a chunk of 1000000000000000 torch.float32 on cpu" in result["error"], result
