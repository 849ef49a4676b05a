"""A `Timeline` as one self-contained HTML page: a heading, the SVG, a legend, the summary.

No script, no external resource: the page is whole when opened from a file or attached to an
issue. The CSS is inline; tooltips are SVG ``<title>`` s. The summary has two tables: the run in
numbers (rounds, restarts by cause, worker exits by cause, nodes) and one row per node (id, host,
first and last time, rounds, ending).
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
.lane-node { font-weight: 600; } svg.timeline .lane-host { fill: #5b6475; font-size: 11px; }
.tick { stroke: #d5d9e0; stroke-dasharray: 2 3; } svg.timeline .tick-label { fill: #5b6475; font-size: 11px; text-anchor: middle; }
.bar.attempt { fill: #4c9a6a; } .bar.attempt.open { fill: url(#open-end); stroke: #4c9a6a; } .open-stripe { fill: #4c9a6a; }
.bar.rendezvous { fill: #9aa7bd; } .bar.excluded { fill: #f2c14e; opacity: .6; }
.mark path, .mark circle, .mark rect { stroke-width: 2; }
.mark.worker_exit path { stroke: #c0392b; } .mark.worker_exit[data-cause="exit 0"] path { stroke: #4c9a6a; }
.mark.restart path { fill: #e67e22; stroke: #fff; stroke-width: 1; }
.mark.restart[data-cause="membership_change"] path { fill: #2e86de; }
.mark.restart[data-cause="store_outage"] path { fill: #8e44ad; }
.mark.member_lost path { fill: #1d2330; } .mark.nodes_waiting circle { fill: #fff; stroke: #2e86de; }
.mark.node_excluded rect { fill: none; stroke: #d4a017; }
.mark.job_finished rect { fill: #4c9a6a; stroke: #fff; } .mark.job_finished:not([data-cause="succeeded"]) rect { fill: #c0392b; }
.mark.gone path { stroke: #1d2330; stroke-width: 3; }
.world-line { fill: none; stroke: #2e86de; stroke-width: 2; } .world-step { fill: #2e86de; }
.world-base { stroke: #9aa7bd; } svg.timeline .world-tick { fill: #5b6475; font-size: 11px; text-anchor: end; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 18px; padding: 0; margin: 10px 0; list-style: none; }
.legend li { display: flex; align-items: center; gap: 6px; }
table { border-collapse: collapse; margin: 4px 0 12px; } th, td { text-align: left; padding: 3px 12px 3px 0; }
th { color: #5b6475; font-weight: 600; } td.num { text-align: right; }
"""

_LEGEND_BARS = ((BarKind.ATTEMPT, "attempt (workers of one round running)"),
                (BarKind.RENDEZVOUS, "rendezvous (waiting for a round to close)"),
                (BarKind.EXCLUDED, "excluded (cooldown after failures)"))
_LEGEND_MARKS = ((MarkKind.WORKER_EXIT, "", "worker exit"),
                 (MarkKind.RESTART, "worker_failure", "restart: worker failure"),
                 (MarkKind.RESTART, "membership_change", "restart: membership change"),
                 (MarkKind.RESTART, "store_outage", "restart: store outage"),
                 (MarkKind.MEMBER_LOST, "", "member lost"),
                 (MarkKind.NODES_WAITING, "", "nodes waiting"),
                 (MarkKind.FINISHED, "succeeded", "finished"),
                 (MarkKind.GONE, "", "gone: no job_finished (killed or lost)"))


def render_page(timeline: Timeline, notes: Sequence[str] = (), geometry: Geometry = Geometry()) -> str:
    """The whole HTML page; ``notes`` are lines shown under the heading (what was skipped)."""
    runs = ", ".join(timeline.run_ids) or "(no run id)"
    summary = timeline.summary
    restarts = sum(count for _, count in summary.restarts)
    started = datetime.datetime.fromtimestamp(timeline.origin, tz=datetime.timezone.utc)
    svg = render_svg(timeline, geometry)
    parts = [
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        f"<title>elastic timeline: {escape(runs)}</title>", f"<style>{_CSS}</style>", "</head>", "<body>",
        f'<h1>Run {escape(runs)}</h1>',
        f'<p class="meta">{summary.nodes} node(s), {summary.rounds} round(s), {restarts} restart(s) over '
        f'{timeline.span:.1f} s from {started.isoformat(timespec="seconds")} (UTC). Times are each agent\'s own '
        "wall clock; hover over a bar or a mark for its details.</p>",
    ]
    parts.extend(f'<p class="notes">{escape(note)}</p>' for note in notes)
    parts += [svg, _legend(), _summary_table(timeline), _nodes_table(timeline), "</body>", "</html>"]
    return "\n".join(parts) + "\n"


def _legend() -> str:
    items = []
    for kind, text in _LEGEND_BARS:
        items.append(f'<li><svg class="legend-symbol" width="28" height="16"><rect class="bar {kind.value}" x="2" '
                     f'y="3" width="24" height="10" rx="2"/></svg>{escape(text)}</li>')
    for kind, cause, text in _LEGEND_MARKS:
        cause_attr = f' data-cause="{cause}"' if cause else ""
        items.append(f'<li><svg class="legend-symbol" width="20" height="20"><g class="mark {kind.value}"'
                     f'{cause_attr}>{symbol(kind, 10, 10)}</g></svg>{escape(text)}</li>')
    items.append('<li><svg class="legend-symbol" width="28" height="16"><path class="world-line" '
                 'd="M2,13H12V4H26"/></svg>world size per round</li>')
    return '<ul class="legend">' + "".join(items) + "</ul>"


def _summary_table(timeline: Timeline) -> str:
    s = timeline.summary
    rows = [("rounds", str(s.rounds)),
            ("restarts", _by_cause(s.restarts)),
            ("worker exits", _by_cause(s.worker_exits)),
            ("nodes", f"{s.nodes} came, {s.gone} went without finishing")]
    body = "".join(f'<tr data-row="{escape(key)}"><th>{escape(key)}</th><td>{escape(value)}</td></tr>'
                   for key, value in rows)
    return f'<h2>Summary</h2><table class="summary">{body}</table>'


def _by_cause(counts: Sequence[tuple[str, int]]) -> str:
    total = sum(count for _, count in counts)
    return f"{total}" + (" (" + ", ".join(f"{cause}: {count}" for cause, count in counts) + ")" if counts else "")


def _nodes_table(timeline: Timeline) -> str:
    head = "<tr><th>node id</th><th>host</th><th>from</th><th>to</th><th>rounds</th><th>ending</th></tr>"
    rows = []
    for lane in timeline.lanes:
        rounds = ", ".join(str(r) for r in lane.rounds) or "none"
        ending = "gone (no job_finished)" if lane.ending == GONE else lane.ending
        rows.append(f'<tr data-node="{escape(lane.node)}"><td>{escape(lane.node)}</td><td>{escape(lane.host)}</td>'
                    f'<td class="num">+{lane.start:.1f} s</td><td class="num">+{lane.end:.1f} s</td>'
                    f"<td>{escape(rounds)}</td><td>{escape(ending)}</td></tr>")
    return f'<h2>Nodes that came and went</h2><table class="nodes">{head}{"".join(rows)}</table>'
