"""The timeline of real runs, opened in headless Chromium, checked against what the workers did.

Two agents on the session's etcd with real gloo workers, each writing its ``--event-log``:

* one of a node's workers is SIGKILLed (a restart), then that node's agent with its workers (a
  node loss: the survivor goes on alone), then the same command is started again on the same
  machine (a new node id, appending to the same file);
* with ``--live-recovery``, one node's worker is SIGKILLed: it restarts alone and heals from the
  survivor, which keeps its process.

``elasticrun timeline`` draws the logs; Chromium (Debian's ``chromium``, which .ci/run installs)
loads the page from a file and dumps its DOM, which must hold exactly that story, with the
training drawn where the workers' own reports say they trained and the downtime where they did
not; a screenshot must render.

``ELASTIC_TIMELINE_SAVE=DIR`` keeps each run's page, screenshot and event logs in DIR/<story>:
how the recorded logs of ``tests/timeline/fixtures`` were made; docs/timeline.png is the page of
``fixtures/kills`` in Chromium (``--screenshot --window-size=1150,1095``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e import FAST_CONF, allreduces_at, etcd_flags, run_id, script, worker_pids  # the agents' e2e helpers

from elastic.testing import agents
from elastic.testing.agents import clean_env

from support.dom import Element, parse
from support.live_agent import read_events

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from live_checks import REPO, TEST_OPTIONS, WORKER, steps  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.needs_torch]  # torch workers

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


def draw_and_browse(tmp_path: Path, logs: list[Path], story: str) -> Element:
    """``elasticrun timeline`` on ``logs``, the DOM Chromium built of it, a screenshot; kept in
    ``$ELASTIC_TIMELINE_SAVE/<story>`` when set."""
    drawn = subprocess.run([sys.executable, "-m", "elastic.run", "timeline", *map(str, logs), "-o", "timeline.html"],
                           cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert drawn.returncode == 0, drawn.stderr
    assert [line for line in drawn.stderr.splitlines() if "wrote timeline.html" not in line] == [], drawn.stderr
    page = tmp_path / "timeline.html"
    dumped = browse(page, tmp_path / "profile", "--dump-dom")
    assert dumped.returncode == 0 and "<svg" in dumped.stdout, dumped.stderr[-2000:]
    shot = tmp_path / "timeline.png"
    taken = browse(page, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1150,1250", "--hide-scrollbars")
    assert taken.returncode == 0 and shot.exists(), taken.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    if os.environ.get("ELASTIC_TIMELINE_SAVE"):
        keep = Path(os.environ["ELASTIC_TIMELINE_SAVE"]) / story
        keep.mkdir(parents=True, exist_ok=True)
        for path in [page, shot, *logs]:
            shutil.copy(path, keep / path.name)
    return parse(dumped.stdout)


class Page:
    """What a test reads of the timeline's DOM: lanes, bars and marks by node, the downtime."""

    def __init__(self, dom: Element) -> None:
        self.dom = dom
        [self.svg] = dom.find_all("svg", "timeline")
        self.origin = float(self.svg.attrs["data-origin"])
        self.lanes = self.svg.find_all("g", "lane")
        self.downtime = self.svg.find_all("g", "downtime")

    def t(self, wall: float) -> float:
        """A wall-clock time on the page's clock."""
        return wall - self.origin

    @staticmethod
    def bars(element: Element, kind: str, node: str | None = None) -> list[tuple[float, float]]:
        return [(float(bar.attrs["data-start"]), float(bar.attrs["data-end"]))
                for bar in element.find_all("rect", "bar")
                if kind in bar.classes and (node is None or bar.attrs["data-node"] == node)]

    @staticmethod
    def marks(element: Element, kind: str, node: str | None = None) -> list[Element]:
        return [mark for mark in element.find_all("g", kind) if node is None or mark.attrs["data-node"] == node]

    def summary(self) -> dict[str, str]:
        [table] = self.dom.find_all("table", "summary")
        return {row.attrs["data-row"]: row.find_all("td")[0].all_text() for row in table.find_all("tr")}

    def assert_no_training_in_downtime(self, trained_at: list[float]) -> None:
        """No worker completed a step while the page says the job did not train."""
        for gap in self.downtime:
            start, end = float(gap.attrs["data-start"]), float(gap.attrs["data-end"])
            inside = [self.t(at) for at in trained_at if start < self.t(at) < end]
            assert not inside, f"steps at {inside[:5]} within the downtime {start:.3f}..{end:.3f}: {gap.title()}"


# -- a worker killed, a node killed, the node back --------------------------------------------------

def story_args(out: Path, stop_file: Path) -> list[str]:
    return [script("allreduce.py"), str(out), "--loop", "--stop-file", str(stop_file), "--max-seconds", "120",
            "--interval", "0.05"]


def test_a_killed_worker_a_killed_node_and_its_return_are_drawn_as_they_happened(procs, reports,  # noqa: F811
                                                                                 etcd_server, tmp_path):
    chromium()  # before the run: no point in it without a browser
    stop_file = tmp_path / "stop"
    logs = [tmp_path / "a.events.jsonl", tmp_path / "b.events.jsonl"]
    flags = ["--nnodes=1:2", "--nproc-per-node=2", "--max-restarts=3", *etcd_flags(etcd_server)]
    a, b = (procs.elasticrun(*flags, f"--event-log={log}", *story_args(reports.path, stop_file), name=name)
            for name, log in zip(("a", "b"), logs))
    reports.wait_for("a world of 4", allreduces_at(4), [a, b])

    # One of b's workers is SIGKILLed: the job restarts with 4 workers.
    first_workers = worker_pids(reports.all())
    victim = min(p.pid for p in b.tree() if p.pid in first_workers)
    worker_killed = time.time()
    os.kill(victim, signal.SIGKILL)
    reports.wait_for("a world of 4 after the worker's kill",
                     allreduces_at(4, after=worker_killed, not_by=first_workers), [a, b])
    # b is SIGKILLed with its workers: a goes on alone.
    node_killed = b.kill_tree().at
    reports.wait_for("a world of 2 after the node's kill", allreduces_at(2, after=node_killed), [a])
    # b's machine comes back: the same command, appending to the same log (a new node id).
    came_back = time.time()
    b2 = procs.elasticrun(*flags, f"--event-log={logs[1]}", *story_args(reports.path, stop_file), name="b2")
    reports.wait_for("a world of 4 after the return", allreduces_at(4, after=came_back), [a, b2])
    stop_file.touch()
    assert [a.wait(), b2.wait()] == [0, 0], [a.stderr[-3000:], b2.stderr[-3000:]]

    page = Page(draw_and_browse(tmp_path, logs, "kills"))
    trained = [r["time"] for r in reports.all() if r["event"] == "allreduce"]
    check_kills(page, worker_killed, node_killed, came_back, trained)


def check_kills(page: Page, worker_killed: float, node_killed: float, came_back: float, trained: list[float]) -> None:
    # Two machines: a's, and b's, on which b's agent and its successor ran one after the other.
    assert [lane.attrs["data-host"] for lane in page.lanes] == [socket.gethostname()] * 2
    [back] = [lane for lane in page.lanes if len(lane.attrs["data-node"].split()) == 2]
    [survivor] = [lane for lane in page.lanes if lane is not back]
    b, b2 = back.attrs["data-node"].split()
    assert [survivor.attrs["data-ending"], back.attrs["data-ending"]] == ["succeeded", "succeeded"]
    [a] = survivor.attrs["data-node"].split()

    # The worker's kill: its SIGKILL on b, and from then no training anywhere until the restart.
    [kill] = [m for m in page.marks(back, "worker_exit", b) if m.attrs["data-cause"] == "SIGKILL"]
    at = float(kill.attrs["data-at"])
    assert page.t(worker_killed) <= at <= page.t(worker_killed) + 2.0, (at, page.t(worker_killed))
    assert not [bar for bar in page.bars(page.svg, "attempt") if bar[0] < at < bar[1] - 0.001], \
        "a bar is green across the worker's kill"
    assert any(start <= at + 0.001 and end > at for start, end in page.bars(survivor, "stalled", a)), \
        "the survivor is not drawn stalled after the kill"

    # The node's kill: b's bars end at the first sign of its loss (after the kill, not at the
    # lease's expiry), marked gone; b2 starts after on the same lane.
    [gone] = page.marks(back, "gone", b)
    died = float(gone.attrs["data-at"])
    assert page.t(node_killed) <= died, (died, page.t(node_killed))
    assert max(end for _, end in page.bars(back, "attempt", b) + page.bars(back, "stalled", b)) <= died + 0.001
    assert "first sign of its loss" in gone.title()
    assert min(start for start, _ in page.bars(back, "rendezvous", b2)) >= page.t(came_back) - 0.5
    assert not [bar for bar in page.bars(page.svg, "attempt") if bar[0] < died < bar[1] - 0.001]

    # The downtime: where no worker completed a step; one interruption per fault at least, each
    # charged to its fault, and the total on the page.
    page.assert_no_training_in_downtime(trained)
    causes = [(gap.attrs["data-cause"], gap.attrs["data-node"], float(gap.attrs["data-start"]))
              for gap in page.downtime]
    assert ("worker_exit", b, at) in causes, causes
    assert ("lost", b, died) in causes, causes
    assert any(start >= page.t(came_back) for _, _, start in causes), causes  # the return stopped the job too
    total = sum(float(gap.attrs["data-seconds"]) for gap in page.downtime)
    # The page rounds each interruption to 3 decimals and the total to 2: equal within rounding.
    shown, _, rest = page.summary()["downtime"].partition(" s in ")
    assert abs(float(shown) - total) <= 0.005 + 0.0005 * len(page.downtime), (shown, total)
    assert rest == f"{len(page.downtime)} interruptions", rest
    [row] = page.svg.find_all("g", "downtime-row")
    assert f"not training: {total:.1f} s" in row.all_text()
    assert page.summary()["nodes"] == "3 came, 1 went without finishing"


# -- a live heal --------------------------------------------------------------------------------------

def live_agent(procs, etcd_server, rid: str, name: str, tmp_path: Path) -> agents.Launched:
    config = etcd_server.client_config()
    env = clean_env(TMPDIR=str(procs.workdir), PYTHONPATH=str(REPO), LIVE_LOG=str(tmp_path / f"{name}.steps.jsonl"),
                    LIVE_SLOT=name, LIVE_STEPS="80", LIVE_STEP_SLEEP="0.1", LIVE_OPTIONS=TEST_OPTIONS, LIVE_CHECK="1",
                    OMP_NUM_THREADS="1")
    return procs.elasticrun(
        "--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "3", "--live-recovery", "--no-prewarm",
        f"--event-log={tmp_path / f'{name}.events.jsonl'}", "--rdzv-backend", "etcd", "--rdzv-endpoint",
        etcd_server.endpoints, "--rdzv-id", rid, "--rdzv-conf",
        f"{FAST_CONF},user={config.user},password={config.password}", "--local-addr", "127.0.0.1", str(WORKER),
        name=name, env=env)


def test_a_live_heal_is_drawn_as_one_and_its_downtime_is_the_survivors_wait(procs, etcd_server, tmp_path):  # noqa: F811
    chromium()
    rid = run_id()
    for name in ("a", "b"):
        live_agent(procs, etcd_server, rid, name, tmp_path)
    step_logs = {name: tmp_path / f"{name}.steps.jsonl" for name in ("a", "b")}
    procs.wait_for("both workers past step 20", lambda: all(
        any(e["step"] >= 20 and e["world"] == 2 for e in steps(read_events(log))) for log in step_logs.values()))
    [victim] = [e["pid"] for e in read_events(step_logs["b"]) if e.get("ev") == "start"]
    wall, mono = time.time(), time.monotonic()  # the workers' step times are monotonic
    os.kill(victim, signal.SIGKILL)
    try:
        assert [procs[name].wait(90) for name in ("a", "b")] == [0, 0], procs.logs()
    finally:
        for e in read_events(step_logs["b"]):  # the replacement, should the agent have left it
            if e.get("ev") == "start" and e["pid"] != victim:
                agents.kill_processes([p for p in agents.process_tree(e["pid"])])
    logs = [tmp_path / "a.events.jsonl", tmp_path / "b.events.jsonl"]
    page = Page(draw_and_browse(tmp_path, logs, "live"))

    to_wall = wall - mono
    survivor_steps = [e["t"] + to_wall for e in steps(read_events(step_logs["a"]))]
    assert len([e for e in read_events(step_logs["a"]) if e.get("ev") == "start"]) == 1  # it kept its process
    check_live(page, wall, survivor_steps,
               [e["t"] + to_wall for e in steps(read_events(step_logs["b"]))])


def check_live(page: Page, killed: float, survivor_steps: list[float], other_steps: list[float]) -> None:
    [a_lane, b_lane] = sorted(page.lanes, key=lambda lane: bool(page.marks(lane, "worker_exit")))
    # The survivor healed (no process restarted); the crashed node restarted its worker.
    assert [m.attrs["data-cause"] for m in page.marks(a_lane, "heal")] == ["worker_failure"]
    assert page.marks(a_lane, "restart") == [] and "workers kept" in page.marks(a_lane, "heal")[0].title()
    assert [m.attrs["data-cause"] for m in page.marks(b_lane, "restart")] == ["worker_failure"]
    assert [m.attrs["data-cause"] for m in page.marks(b_lane, "worker_exit")] == ["SIGKILL"]
    # The downtime is the survivor's wait: from the kill to its first step in the healed round.
    [gap] = page.downtime
    start, end = float(gap.attrs["data-start"]), float(gap.attrs["data-end"])
    before = max(at for at in survivor_steps if at < killed)
    after = min(at for at in survivor_steps if at > killed)
    assert page.t(before) <= start <= page.t(killed) + 1.0, (page.t(before), start, page.t(killed))
    assert end <= page.t(after), (end, page.t(after))
    assert end - start >= 0.8 * (after - before) - 0.3, (end - start, after - before)  # the wait, not the round's close
    page.assert_no_training_in_downtime(survivor_steps + other_steps)
    # The survivor is drawn not training (stalled, then resuming) until it formed the healed round
    # (its agent may see the formation a little before the replacement's does).
    green_again = min(s for s, e in page.bars(a_lane, "attempt") if e > start + 0.001)
    assert end - 0.5 <= green_again <= end, (green_again, end)
    assert page.bars(a_lane, "resuming")
    assert page.summary()["live heals"].startswith("1 ")
