"""A `Timeline` as one inline SVG element: lanes, bars, marks, the time axis, the job's downtime
and the world size.

Only serialization: every position comes from the layout's numbers and the fixed `Geometry`.
Every element carries its meaning in ``class`` and ``data-*`` attributes (``data-node``,
``data-round``, ``data-cause``, ``data-seconds``) and a ``<title>`` child, which browsers show as
a tooltip; all text is escaped (node ids and reasons come from files). Colours live in the page's
CSS. Linear in the bars and marks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

from elastic.timeline.downtime import Interruption
from elastic.timeline.layout import Bar, BarKind, Lane, Mark, MarkKind, Timeline

__all__ = ["Geometry", "render_svg", "symbol", "tick_label", "tick_step"]


@dataclass(frozen=True)
class Geometry:
    """Sizes in pixels."""

    width: int = 1100
    label_width: int = 240
    right_margin: int = 24
    axis_height: int = 28
    lane_height: int = 46
    downtime_height: int = 34
    world_height: int = 110
    world_gap: int = 36


# Stripes for a bar whose end was not recorded (its agent was killed or lost).
_DEFS = ('<defs>' + "".join(
    f'<pattern id="open-{kind}" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
    f'<rect class="open-stripe {kind}" width="3" height="6"/></pattern>' for kind in ("attempt", "stalled", "resuming"))
    + '</defs>')
# Where a mark sits in its lane (a fraction of its height): what happened above the bars, what the
# agent did below, endings on them.
_ROWS = {MarkKind.WORKER_EXIT: 0.17, MarkKind.MEMBER_LOST: 0.17, MarkKind.NODES_WAITING: 0.17,
         MarkKind.RESTART: 0.83, MarkKind.HEAL: 0.83, MarkKind.EXCLUDED: 0.83,
         MarkKind.FINISHED: 0.5, MarkKind.GONE: 0.5}
_NICE_STEPS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 43200, 86400)


def render_svg(timeline: Timeline, geometry: Geometry = Geometry()) -> str:
    """The ``<svg class="timeline">`` element of ``timeline``."""
    g = geometry
    lanes_bottom = g.axis_height + g.lane_height * len(timeline.lanes)
    downtime_bottom = lanes_bottom + g.downtime_height
    height = downtime_bottom + g.world_gap + g.world_height + 24
    x = _scale(timeline.span, g)
    parts = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{g.width}" height="{height}" '
             f'viewBox="0 0 {g.width} {height}" role="img" aria-label="timeline of {len(timeline.lanes)} machines" '
             f'data-origin="{timeline.origin:.3f}">',
             _DEFS, _axis(timeline.span, x, g, lanes_bottom)]
    bars: dict[int, list[Bar]] = {}
    marks: dict[int, list[Mark]] = {}
    for bar in timeline.bars:
        bars.setdefault(bar.lane, []).append(bar)
    for mark in timeline.marks:
        marks.setdefault(mark.lane, []).append(mark)
    for index, lane in enumerate(timeline.lanes):
        parts.append(_lane(index, lane, bars.get(index, []), marks.get(index, []), x, g))
    parts.append(_downtime(timeline.downtime, x, g, lanes_bottom))
    parts.append(_world(timeline, x, g, downtime_bottom + g.world_gap))
    parts.append("</svg>")
    return "\n".join(parts)


def symbol(kind: MarkKind, cx: float, cy: float) -> str:
    """The shape of a mark of ``kind`` centred at ``(cx, cy)``, without attributes of meaning."""
    if kind is MarkKind.WORKER_EXIT:
        return f'<path d="M{cx - 5:.1f},{cy - 5:.1f}L{cx + 5:.1f},{cy + 5:.1f}M{cx - 5:.1f},{cy + 5:.1f}L{cx + 5:.1f},{cy - 5:.1f}"/>'
    if kind in (MarkKind.RESTART, MarkKind.HEAL):
        return f'<path d="M{cx - 6:.1f},{cy - 5:.1f}L{cx + 6:.1f},{cy - 5:.1f}L{cx:.1f},{cy + 5:.1f}Z"/>'
    if kind is MarkKind.MEMBER_LOST:
        return f'<path d="M{cx:.1f},{cy - 6:.1f}L{cx + 6:.1f},{cy:.1f}L{cx:.1f},{cy + 6:.1f}L{cx - 6:.1f},{cy:.1f}Z"/>'
    if kind is MarkKind.NODES_WAITING:
        return f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5"/>'
    if kind is MarkKind.GONE:
        return f'<path d="M{cx:.1f},{cy - 8:.1f}L{cx:.1f},{cy + 8:.1f}M{cx - 5:.1f},{cy - 5:.1f}L{cx + 5:.1f},{cy + 5:.1f}M{cx - 5:.1f},{cy + 5:.1f}L{cx + 5:.1f},{cy - 5:.1f}"/>'
    return f'<rect x="{cx - 5:.1f}" y="{cy - 5:.1f}" width="10" height="10"/>'  # finished, excluded


class _Scale:
    def __init__(self, span: float, left: float, right: float) -> None:
        self.span = max(span, 1e-9) if math.isfinite(span) else 1e-9
        self.left, self.right = left, right

    def __call__(self, seconds: float) -> float:
        return self.left + (self.right - self.left) * max(0.0, min(seconds, self.span)) / self.span


def _scale(span: float, g: Geometry) -> _Scale:
    return _Scale(span, g.label_width, g.width - g.right_margin)


def tick_step(span: float, most: int = 12) -> float:
    """The smallest nice step that puts at most ``most`` ticks on ``span`` seconds (1 s for a
    span that is not a finite number)."""
    if not math.isfinite(span):
        return 1.0
    return next((step for step in _NICE_STEPS if span / step <= most), math.ceil(span / most / 86400) * 86400)


def tick_label(seconds: float, step: float) -> str:
    """``+1.5 s`` under two minutes (decimals when the step needs them), else ``+m:ss`` or ``+h:mm:ss``."""
    if step < 60 and seconds < 120:
        return f"+{seconds:.1f} s" if step < 1 else f"+{seconds:.0f} s"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    return f"+{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"+{rest // 60}:{rest % 60:02d}"


def _axis(span: float, x: _Scale, g: Geometry, bottom: int) -> str:
    step = tick_step(span)
    parts = ['<g class="axis">']
    count = min(int(span / step + 1e-9), 1000) if math.isfinite(span) else 0
    for i in range(count + 1):
        at = i * step
        px = x(at)
        parts.append(f'<line class="tick" x1="{px:.1f}" y1="{g.axis_height - 6}" x2="{px:.1f}" y2="{bottom}"/>'
                     f'<text class="tick-label" x="{px:.1f}" y="{g.axis_height - 10}">{tick_label(at, step)}</text>')
    parts.append("</g>")
    return "".join(parts)


def _lane(index: int, lane: Lane, bars: list[Bar], marks: list[Mark], x: _Scale, g: Geometry) -> str:
    top = g.axis_height + index * g.lane_height
    mid = top + g.lane_height / 2
    nodes, host = escape(" ".join(lane.nodes)), escape(lane.host)
    agents = (escape(_cut(lane.nodes[0], 28)) if len(lane.nodes) == 1
              else f"{len(lane.nodes)} agents: {escape(_cut(lane.nodes[-1], 18))}")
    parts = [f'<g class="lane" data-node="{nodes}" data-host="{host}" data-ending="{escape(lane.ending)}">',
             f'<rect class="lane-bg" x="0" y="{top}" width="{g.width}" height="{g.lane_height}"/>',
             f'<text class="lane-host" x="8" y="{mid - 3:.1f}"><title>machine {host}; node ids (one per agent, '
             f'in order): {escape(", ".join(lane.nodes))}</title>{escape(_cut(lane.host, 30))}</text>',
             f'<text class="lane-node" x="8" y="{mid + 12:.1f}">{agents} · {escape(lane.ending)}</text>']
    for bar in bars:
        parts.append(_bar(bar, x, mid))
    for mark in marks:
        parts.append(_mark(mark, x, top, g))
    parts.append("</g>")
    return "\n".join(parts)


_HEIGHTS = {BarKind.ATTEMPT: 14, BarKind.STALLED: 14, BarKind.RESUMING: 14, BarKind.RENDEZVOUS: 6,
            BarKind.EXCLUDED: 10}


def _bar(bar: Bar, x: _Scale, mid: float) -> str:
    height = _HEIGHTS[bar.kind]
    left, right = x(bar.start), x(bar.end)
    round_attr = f' data-round="{bar.round}"' if bar.round is not None else ""
    open_class = " open" if not bar.ended else ""
    return (f'<rect class="bar {bar.kind.value}{open_class}"{round_attr} data-node="{escape(bar.node)}" '
            f'x="{left:.1f}" y="{mid - height / 2:.1f}" width="{max(right - left, 1.5):.1f}" height="{height}" rx="2" '
            f'data-start="{bar.start:.3f}" data-end="{bar.end:.3f}"><title>{escape(bar.label)}</title></rect>')


def _mark(mark: Mark, x: _Scale, top: float, g: Geometry) -> str:
    cy = _ROWS.get(mark.kind, 0.5) * g.lane_height + top
    shape = symbol(mark.kind, x(mark.at), cy)
    return (f'<g class="mark {mark.kind.value}" data-cause="{escape(mark.cause)}" data-node="{escape(mark.node)}" '
            f'data-at="{mark.at:.3f}"><title>{escape(mark.label)}</title>{shape}</g>')


def _downtime(downtime: tuple[Interruption, ...], x: _Scale, g: Geometry, lanes_bottom: int) -> str:
    """The row of the job's downtime, each interruption shaded over the lanes too, with its seconds."""
    total = sum(i.seconds for i in downtime)
    top = lanes_bottom + 4
    height = g.downtime_height - 8
    parts = [f'<g class="downtime-row" data-seconds="{total:.3f}" data-count="{len(downtime)}">',
             f'<text class="downtime-label" x="8" y="{top + height / 2 + 4:.1f}">not training: {total:.1f} s'
             f'<title>downtime: the time the job did not train, in {len(downtime)} interruption(s)</title></text>']
    for number, gap in enumerate(downtime, 1):
        left, right = x(gap.start), x(gap.end)
        width = max(right - left, 1.5)
        resumed = (f"training resumed at +{gap.end:.2f} s (round {gap.resumed_in})" if gap.resumed
                   else "training did not resume before the logs end")
        first = f" (first sign: {gap.cause.first_sign})" if gap.cause.first_sign else ""
        title = (f"downtime {number}: {gap.seconds:.2f} s from +{gap.start:.2f} s, round {gap.stopped_round} stopped: "
                 f"{gap.cause.what}{first}; {resumed}")
        open_class = "" if gap.resumed else " open"
        parts.append(f'<g class="downtime{open_class}" data-cause="{escape(gap.cause.kind)}" '
                     f'data-node="{escape(gap.cause.node)}" data-seconds="{gap.seconds:.3f}" '
                     f'data-start="{gap.start:.3f}" data-end="{gap.end:.3f}"><title>{escape(title)}</title>'
                     f'<rect class="downtime-shade" x="{left:.1f}" y="{g.axis_height}" width="{width:.1f}" '
                     f'height="{lanes_bottom - g.axis_height}"/>'
                     f'<rect class="downtime-bar" x="{left:.1f}" y="{top}" width="{width:.1f}" height="{height}" rx="2"/>'
                     f'<text class="downtime-seconds" x="{right + 3:.1f}" y="{top + height / 2 + 4:.1f}">'
                     f'{gap.seconds:.1f} s</text></g>')
    parts.append("</g>")
    return "\n".join(parts)


def _world(timeline: Timeline, x: _Scale, g: Geometry, top: int) -> str:
    steps = timeline.world
    biggest = max((s.size for s in steps), default=0) or 1
    bottom = top + g.world_height

    def y(size: int) -> float:
        return bottom - (g.world_height - 10) * size / biggest

    parts = [f'<g class="world" data-unit="{timeline.world_unit}">',
             f'<text class="world-label" x="8" y="{top + g.world_height / 2:.1f}">world size ({timeline.world_unit})</text>',
             f'<line class="world-base" x1="{x(0):.1f}" y1="{bottom}" x2="{x(timeline.span):.1f}" y2="{bottom}"/>',
             f'<text class="world-tick" x="{x(0) - 6:.1f}" y="{y(biggest) + 4:.1f}">{biggest}</text>',
             f'<text class="world-tick" x="{x(0) - 6:.1f}" y="{bottom + 4}">0</text>']
    if steps:
        points = [f"M{x(steps[0].at):.1f},{y(steps[0].size):.1f}"]
        for step in steps[1:]:
            points.append(f"H{x(step.at):.1f}V{y(step.size):.1f}")
        points.append(f"H{x(timeline.span):.1f}")
        parts.append(f'<path class="world-line" d="{"".join(points)}"/>')
        for step in steps:
            parts.append(f'<circle class="world-step" data-round="{step.round}" data-size="{step.size}" '
                         f'cx="{x(step.at):.1f}" cy="{y(step.size):.1f}" r="3">'
                         f'<title>round {step.round}: {step.size} {timeline.world_unit} from +{step.at:.2f} s</title>'
                         f'</circle>')
    parts.append("</g>")
    return "\n".join(parts)


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"
