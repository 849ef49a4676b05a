"""The timeline of a real run, opened in headless Chromium.

Two agents on the session's etcd with real gloo workers, each writing its ``--event-log``; a
worker crashes once (a counted restart), one agent is SIGKILLed with its workers (a node loss:
the survivor goes on alone), then started again (a rejoin under a new node id, appending to the
same file). ``elasticrun timeline`` draws both files; Chromium (Debian's ``chromium``, which
.ci/run installs) loads the page from a file and dumps its DOM, which must hold the lanes, bars
and marks of exactly that story; a screenshot must render.

``ELASTIC_TIMELINE_SAVE=DIR`` keeps the page and the screenshot in DIR (how docs/timeline.png
is made).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e import allreduces_at, etcd_flags, script  # the end-to-end helpers of the agent's tests

from elastic.testing.agents import clean_env

from elastic.testing.dom import Element, parse

pytestmark = pytest.mark.slow

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"]


def chromium() -> str:
    """Debian's chromium, or the test fails with one line (never skips)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not installed: the timeline test needs Debian's chromium "
                    "(apt-get install -y chromium; .ci/run installs it)", pytrace=False)
    return found


def browse(page: Path, profile: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *flags, page.as_uri()],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def story_args(out: Path, stop_file: Path) -> list[str]:
    """Loop all-reducing until the stop file; rank 1 exits 1 one second in while the restart count is 0."""
    return [script("allreduce.py"), str(out), "--loop", "--stop-file", str(stop_file), "--max-seconds", "120",
            "--interval", "0.05", "--crash-rank", "1", "--crash-restart", "0", "--crash-after", "1.0"]


def test_a_runs_crash_node_loss_and_rejoin_are_drawn_and_load_in_chromium(procs, reports, etcd_server,  # noqa: F811
                                                                            tmp_path):
    chromium()  # before the run: no point in it without a browser
    stop_file = tmp_path / "stop"
    logs = [tmp_path / "a.events.jsonl", tmp_path / "b.events.jsonl"]
    flags = ["--nnodes=1:2", "--nproc-per-node=2", "--max-restarts=3", *etcd_flags(etcd_server)]
    a, b = (procs.elasticrun(*flags, f"--event-log={log}", *story_args(reports.path, stop_file), name=name)
            for name, log in zip(("a", "b"), logs))

    # The crash, then a world of 4 after the counted restart.
    reports.wait_for("the crash", lambda records: any(r["event"] == "crash" for r in records), [a, b])
    reports.wait_for("a world of 4 after the restart", lambda records: {
        r["rank"] for r in records if r["event"] == "allreduce" and r["world_size"] == 4 and r["restart_count"] == 1
    } == set(range(4)), [a, b])
    # A node loss: the survivor goes on alone.
    killed_at = b.kill_tree().at
    reports.wait_for("a world of 2 after the kill", allreduces_at(2, after=killed_at), [a])
    # The rejoin: the same command again, appending to the same log under a new node id.
    rejoined_at = time.time()
    b2 = procs.elasticrun(*flags, f"--event-log={logs[1]}", *story_args(reports.path, stop_file), name="b2")
    reports.wait_for("a world of 4 after the rejoin", allreduces_at(4, after=rejoined_at), [a, b2])
    stop_file.touch()
    assert [a.wait(), b2.wait()] == [0, 0], [a.stderr[-3000:], b2.stderr[-3000:]]

    drawn = subprocess.run([sys.executable, "-m", "elastic.run", "timeline", *map(str, logs), "-o", "timeline.html"],
                           cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert drawn.returncode == 0, drawn.stderr
    assert drawn.stderr.splitlines() == [line for line in drawn.stderr.splitlines() if "wrote timeline.html" in line]
    page = tmp_path / "timeline.html"

    dumped = browse(page, tmp_path / "profile", "--dump-dom")
    assert dumped.returncode == 0 and "<svg" in dumped.stdout, dumped.stderr[-2000:]
    check_story(parse(dumped.stdout))

    shot = tmp_path / "timeline.png"
    taken = browse(page, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1150,900",
                   "--hide-scrollbars")
    assert taken.returncode == 0 and shot.exists(), taken.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    if os.environ.get("ELASTIC_TIMELINE_SAVE"):
        keep = Path(os.environ["ELASTIC_TIMELINE_SAVE"])
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(page, keep / page.name)
        shutil.copy(shot, keep / shot.name)


def check_story(dom: Element) -> None:
    """The DOM Chromium built holds the run's story: three lanes on one host, the crash, the loss
    and the rejoin, with their causes."""
    [svg] = dom.find_all("svg", "timeline")
    lanes = svg.find_all("g", "lane")
    assert [lane.attrs["data-host"] for lane in lanes] == [socket.gethostname()] * 3
    assert len({lane.attrs["data-node"] for lane in lanes}) == 3  # a, b and b's successor: three node ids
    endings = [lane.attrs["data-ending"] for lane in lanes]
    assert sorted(endings) == ["gone", "succeeded", "succeeded"], endings
    survivor = next(lane for lane in lanes if lane.attrs["data-ending"] == "succeeded")
    gone = next(lane for lane in lanes if lane.attrs["data-ending"] == "gone")
    rejoined = lanes[2]
    assert rejoined.attrs["data-ending"] == "succeeded" and rejoined is not survivor

    def causes(lane: Element, kind: str) -> list[str]:
        return [mark.attrs["data-cause"] for mark in lane.find_all("g", kind)]

    # The crash: rank 1 exits 1, and a counted restart on the nodes of that round.
    assert "exit 1" in causes(survivor, "worker_exit") + causes(gone, "worker_exit")
    assert "worker_failure" in causes(survivor, "restart")
    # The loss: the survivor reports a member lost and restarts alone (membership change); the
    # killed agent's lane ends with an open attempt and a "gone" mark.
    assert causes(survivor, "member_lost") and causes(gone, "gone") == ["gone"]
    assert len(gone.find_all("rect", "open")) == 1
    assert "a peer acted on its loss at" in gone.find_all("g", "gone")[0].title()
    assert causes(survivor, "restart").count("membership_change") >= 2  # the loss, then the rejoin
    # Attempts and rounds: the survivor ran one attempt per round it joined.
    attempts = survivor.find_all("rect", "attempt")
    assert len(attempts) == len(survivor.find_all("rect", "rendezvous")) >= 4
    assert all(bar.title() for bar in attempts)
    assert causes(survivor, "job_finished") == ["succeeded"] == causes(rejoined, "job_finished")
    # The world: 4 workers, 2 while alone, 4 again after the rejoin.
    [world] = svg.find_all("g", "world")
    sizes = [int(step.attrs["data-size"]) for step in world.find_all("circle", "world-step")]
    # (The first round may have closed with one node if the other came after the last call.)
    assert world.attrs["data-unit"] == "workers" and 4 in sizes[:-2] and sizes[-2:] == [2, 4], sizes
    # The summary.
    [summary] = dom.find_all("table", "summary")
    rows = {row.attrs["data-row"]: row.find_all("td")[0].all_text() for row in summary.find_all("tr")}
    assert "worker_failure: 1" in rows["restarts"] and "membership_change" in rows["restarts"], rows
    assert rows["nodes"] == "3 came, 1 went without finishing"
