"""A `Timeline` as one self-contained HTML page: a heading, the SVG, a legend, the summary.

No script, no external resource: the page is whole when opened from a file or attached to an
issue. The CSS is inline; tooltips are SVG ``<title>`` s. Three tables: the run in numbers
(rounds, restarts by cause, live heals, worker exits by cause, machines and agents, downtime),
the downtime fault by fault (see :mod:`elastic.timeline.downtime`), and one row per agent (node
id, host, machine lane, first and last time, rounds, ending).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from html import escape

from elastic.timeline.layout import GONE, BarKind, MarkKind, Timeline
from elastic.timeline.svg import Geometry, render_svg, symbol

__all__ = ["render_page"]

_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1d2330; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 20px 0 6px; }
.meta, .notes { color: #5b6475; margin: 0 0 12px; }
svg.timeline text { font: 12px system-ui, sans-serif; fill: #1d2330; }
.lane-bg { fill: #f6f7f9; stroke: #fff; stroke-width: 2; } .lane:nth-of-type(even) .lane-bg { fill: #eceef2; }
.lane-host { font-weight: 600; } svg.timeline .lane-node { fill: #5b6475; font-size: 11px; }
.tick { stroke: #d5d9e0; stroke-dasharray: 2 3; } svg.timeline .tick-label { fill: #5b6475; font-size: 11px; text-anchor: middle; }
.bar.attempt { fill: #4c9a6a; } .bar.attempt.open { fill: url(#open-attempt); stroke: #4c9a6a; }
.bar.stalled { fill: #e9a3a0; } .bar.stalled.open { fill: url(#open-stalled); stroke: #e9a3a0; }
.bar.resuming { fill: #b9dcc6; } .bar.resuming.open { fill: url(#open-resuming); stroke: #b9dcc6; }
.open-stripe.attempt { fill: #4c9a6a; } .open-stripe.stalled { fill: #e9a3a0; } .open-stripe.resuming { fill: #b9dcc6; }
.bar.rendezvous { fill: #9aa7bd; } .bar.excluded { fill: #f2c14e; opacity: .6; }
.downtime-shade { fill: #c0392b; opacity: .08; pointer-events: none; } .downtime-bar { fill: #c0392b; }
.downtime.open .downtime-bar { opacity: .5; }
svg.timeline .downtime-seconds { fill: #c0392b; font-size: 11px; font-weight: 600; }
svg.timeline .downtime-label { fill: #c0392b; font-weight: 600; }
.mark path, .mark circle, .mark rect { stroke-width: 2; }
.mark.worker_exit path { stroke: #c0392b; } .mark.worker_exit[data-cause="exit 0"] path { stroke: #4c9a6a; }
.mark.restart path { fill: #e67e22; stroke: #fff; stroke-width: 1; }
.mark.restart[data-cause="membership_change"] path { fill: #2e86de; }
.mark.restart[data-cause="store_outage"] path { fill: #8e44ad; }
.mark.heal path { fill: #fff; stroke: #4c9a6a; stroke-width: 2; }
.mark.member_lost path { fill: #1d2330; } .mark.nodes_waiting circle { fill: #fff; stroke: #2e86de; }
.mark.node_excluded rect { fill: none; stroke: #d4a017; }
.mark.job_finished rect { fill: #4c9a6a; stroke: #fff; } .mark.job_finished:not([data-cause="succeeded"]) rect { fill: #c0392b; }
.mark.gone path { stroke: #1d2330; stroke-width: 3; }
.world-line { fill: none; stroke: #2e86de; stroke-width: 2; } .world-step { fill: #2e86de; }
.world-base { stroke: #9aa7bd; } svg.timeline .world-tick { fill: #5b6475; font-size: 11px; text-anchor: end; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 18px; padding: 0; margin: 10px 0; list-style: none; }
.legend li { display: flex; align-items: center; gap: 6px; }
table { border-collapse: collapse; margin: 4px 0 12px; } th, td { text-align: left; padding: 3px 12px 3px 0; }
th { color: #5b6475; font-weight: 600; } td.num { text-align: right; white-space: nowrap; }
"""

_LEGEND_BARS = ((BarKind.ATTEMPT, "training (the workers of a round)"),
                (BarKind.RESUMING, "resuming (workers starting or re-forming the group)"),
                (BarKind.STALLED, "stalled (the round stopped: a failure, a member left or died)"),
                (BarKind.RENDEZVOUS, "rendezvous (waiting for a round to close)"),
                (BarKind.EXCLUDED, "excluded (cooldown after failures)"))
_LEGEND_MARKS = ((MarkKind.WORKER_EXIT, "", "worker exit"),
                 (MarkKind.RESTART, "worker_failure", "restart: worker failure"),
                 (MarkKind.RESTART, "membership_change", "restart: membership change"),
                 (MarkKind.RESTART, "store_outage", "restart: store outage"),
                 (MarkKind.HEAL, "", "live heal: workers kept (--live-recovery)"),
                 (MarkKind.MEMBER_LOST, "", "member lost"),
                 (MarkKind.NODES_WAITING, "", "nodes waiting"),
                 (MarkKind.FINISHED, "succeeded", "finished"),
                 (MarkKind.GONE, "", "gone: no job_finished (killed or lost)"))


def render_page(timeline: Timeline, notes: Sequence[str] = (), geometry: Geometry = Geometry()) -> str:
    """The whole HTML page; ``notes`` are lines shown under the heading (what was skipped)."""
    runs = ", ".join(timeline.run_ids) or "(no run id)"
    summary = timeline.summary
    restarts = sum(count for _, count in summary.restarts)
    svg = render_svg(timeline, geometry)
    parts = [
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        f"<title>elastic timeline: {escape(runs)}</title>", f"<style>{_CSS}</style>", "</head>", "<body>",
        f'<h1>Run {escape(runs)}</h1>',
        f'<p class="meta">{summary.machines} machine(s), {summary.nodes} agent(s), {summary.rounds} round(s), '
        f'{restarts} restart(s), {summary.downtime:.1f} s not training over {timeline.span:.1f} s from '
        f'{_utc(timeline.origin)}. Times are each agent\'s own wall clock; hover over a bar or a mark for its '
        "details.</p>",
    ]
    parts.extend(f'<p class="notes">{escape(note)}</p>' for note in notes)
    parts += [svg, _legend(), _summary_table(timeline), _downtime_table(timeline), _nodes_table(timeline),
              "</body>", "</html>"]
    return "\n".join(parts) + "\n"


def _utc(seconds: float) -> str:
    """``2025-01-02T03:04:05+00:00 (UTC)``, or the seconds when no date can say them."""
    try:
        moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return f"{seconds:.0f} s since the epoch"
    return f"{moment.isoformat(timespec='seconds')} (UTC)"


def _legend() -> str:
    items = []
    for kind, text in _LEGEND_BARS:
        items.append(f'<li><svg class="legend-symbol" width="28" height="16"><rect class="bar {kind.value}" x="2" '
                     f'y="3" width="24" height="10" rx="2"/></svg>{escape(text)}</li>')
    for kind, cause, text in _LEGEND_MARKS:
        cause_attr = f' data-cause="{cause}"' if cause else ""
        items.append(f'<li><svg class="legend-symbol" width="20" height="20"><g class="mark {kind.value}"'
                     f'{cause_attr}>{symbol(kind, 10, 10)}</g></svg>{escape(text)}</li>')
    items.append('<li><svg class="legend-symbol" width="28" height="16"><rect class="downtime-bar" x="2" y="3" '
                 'width="24" height="10" rx="2"/></svg>downtime (the job not training)</li>')
    items.append('<li><svg class="legend-symbol" width="28" height="16"><path class="world-line" '
                 'd="M2,13H12V4H26"/></svg>world size per round</li>')
    return '<ul class="legend">' + "".join(items) + "</ul>"


def _summary_table(timeline: Timeline) -> str:
    s = timeline.summary
    rows = [("rounds", str(s.rounds)),
            ("restarts", _by_cause(s.restarts)),
            ("live heals", f"{s.heals} (a node kept its workers through a restart)"),
            ("worker exits", _by_cause(s.worker_exits)),
            ("nodes", f"{s.nodes} came, {s.gone} went without finishing"),
            ("machines", f"{s.machines} (a lane each; a restarted agent stays on its machine's lane)"),
            ("downtime", f"{s.downtime:.2f} s in {s.interruptions} interruption{'' if s.interruptions == 1 else 's'}")]
    body = "".join(f'<tr data-row="{escape(key)}"><th>{escape(key)}</th><td>{escape(value)}</td></tr>'
                   for key, value in rows)
    return f'<h2>Summary</h2><table class="summary">{body}</table>'


def _by_cause(counts: Sequence[tuple[str, int]]) -> str:
    total = sum(count for _, count in counts)
    return f"{total}" + (" (" + ", ".join(f"{cause}: {count}" for cause, count in counts) + ")" if counts else "")





_DOWNTIME_DEFINITION = (
    "Downtime is the time the job did not train: from the first sign of a fault (a worker's failure; a node's "
    "death, taken as the first sign of it its peers recorded; a member leaving for a new round) to when every "
    "member of the next round trained again (its workers started anew, or the ones --live-recovery kept formed "
    "the round). A worker's own start-up (importing torch, forming its process group) is not in the logs and "
    "not counted. The start of the job and the end of one that finished are not downtime.")


def _downtime_table(timeline: Timeline) -> str:
    head = ("<tr><th>#</th><th>from</th><th>to</th><th>seconds</th><th>what stopped the job</th>"
            "<th>rounds</th></tr>")
    rows = []
    for number, gap in enumerate(timeline.downtime, 1):
        first = f" (first sign: {gap.cause.first_sign})" if gap.cause.first_sign else ""
        resumed = f"{gap.stopped_round} → {gap.resumed_in}" if gap.resumed else f"{gap.stopped_round} → not resumed"
        rows.append(f'<tr data-cause="{escape(gap.cause.kind)}" data-seconds="{gap.seconds:.3f}">'
                    f'<td class="num">{number}</td><td class="num">+{gap.start:.2f} s</td>'
                    f'<td class="num">+{gap.end:.2f} s</td><td class="num">{gap.seconds:.2f} s</td>'
                    f"<td>{escape(gap.cause.what + first)}</td><td>{escape(resumed)}</td></tr>")
    total = sum(gap.seconds for gap in timeline.downtime)
    rows.append(f'<tr data-row="total"><th></th><th>total</th><th></th><td class="num">{total:.2f} s</td>'
                f"<td>{len(timeline.downtime)} interruption{'' if len(timeline.downtime) == 1 else 's'}</td>"
                "<td></td></tr>")
    return (f'<h2>Downtime</h2><p class="definition">{escape(_DOWNTIME_DEFINITION)}</p>'
            f'<table class="downtime">{head}{"".join(rows)}</table>')


def _nodes_table(timeline: Timeline) -> str:
    head = ("<tr><th>node id</th><th>host</th><th>machine</th><th>from</th><th>to</th><th>rounds</th>"
            "<th>ending</th></tr>")
    rows = []
    for agent in timeline.agents:
        rounds = ", ".join(str(r) for r in agent.rounds) or "none"
        ending = f"gone: {agent.lost}" if agent.ending == GONE else agent.ending
        rows.append(f'<tr data-node="{escape(agent.node)}" data-lane="{agent.lane}"><td>{escape(agent.node)}</td>'
                    f'<td>{escape(agent.host)}</td><td class="num">{agent.lane + 1}</td>'
                    f'<td class="num">+{agent.start:.1f} s</td><td class="num">+{agent.end:.1f} s</td>'
                    f"<td>{escape(rounds)}</td><td>{escape(ending)}</td></tr>")
    return f'<h2>Nodes that came and went</h2><table class="nodes">{head}{"".join(rows)}</table>'
