"""A finished job's ``--rdzv-id`` used again (issue 34 item 8): real elasticrun agents on etcd.

A node that arrives after its run id's job finished ran nothing: it exits 3, so a pipeline or a
reinstalled chart notices (``--rdzv-conf already_finished_ok=1``: 0, as before). A node that
took part in the job exits 0 when it ends: here a spare that waited for room while the job
trained. The workers are plain Python (no torch): each waits for a stop file.
"""

from __future__ import annotations

import pytest

from e2e import etcd_flags

pytestmark = [pytest.mark.slow, pytest.mark.etcd]

WAIT_FOR_STOP = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.05)\n"


def test_a_spare_exits_0_at_the_jobs_end_and_a_node_arriving_after_it_exits_3(procs, tmp_path, etcd_server):
    (tmp_path / "train.py").write_text(WAIT_FOR_STOP)
    stop = tmp_path / "stop"
    job = ["--nnodes=1:1", "--nproc-per-node=1", *etcd_flags(etcd_server), str(tmp_path / "train.py"), str(stop)]
    member = procs.elasticrun(*job, name="member")
    procs.wait_for("the member's world", lambda: "formed a world of 1 worker" in member.stderr, names=["member"])
    spare = procs.elasticrun(*job, name="spare")
    procs.wait_for("the spare to wait", lambda: "waits as a spare" in spare.stderr, names=["spare"])
    stop.touch()

    assert member.wait() == 0, member.stderr
    assert spare.wait() == 0, spare.stderr
    assert "while this node waited to join; it trained nothing and stops" in spare.stderr, spare.stderr
    assert "did nothing (the job finished while this node waited to join)" in spare.stderr, spare.stderr

    late = procs.elasticrun(*job, name="late")
    assert late.wait() == 3, late.stderr
    assert ("before this node arrived; nothing to do, exit code 3 (use a new --rdzv-id to run the job again, or add "
            "--rdzv-conf already_finished_ok=1 to exit 0 here)") in late.stderr, late.stderr
    assert "did nothing (the job had already finished)" in late.stderr, late.stderr

    conf = job.index("--rdzv-conf") + 1
    fine = procs.elasticrun(*job[:conf], job[conf] + ",already_finished_ok=1", *job[conf + 1:], name="fine")
    assert fine.wait() == 0, fine.stderr
    assert "before this node arrived; nothing to do (use a new --rdzv-id" in fine.stderr, fine.stderr
