"""The console line for a membership change says "restarting" only when a restart follows: a
node whose job finished elsewhere while its own workers succeeded ends, it does not restart."""

from __future__ import annotations

import io
import logging

import pytest

from elastic.agent.observe.events import EventLog
from elastic.agent.observe.report import AgentReport
from elastic.rendezvous.api import MembershipChange, MembershipStatus


@pytest.mark.parametrize("restarting, says_restart", [(True, True), (False, False)])
def test_the_change_line_names_a_restart_only_when_one_follows(tmp_path, caplog, restarting, says_restart):
    events = EventLog(tmp_path / "events.jsonl", run_id="job", node="a")
    report = AgentReport(events, None, io.StringIO(), run_id="job", host="h")
    status = MembershipStatus(MembershipChange.CLOSED, "the job finished on node b in round 0")
    with caplog.at_level(logging.INFO, logger="elastic.agent.observe.report"):
        report.change(status, restarting=restarting)
    lines = [record.getMessage() for record in caplog.records]
    assert any("the job finished on node b in round 0" in line for line in lines), lines
    assert any("restarting the workers" in line for line in lines) is says_restart, lines
