"""Checks a Grafana dashboard's PromQL against the series an agent really exports.

A dashboard that names a metric or a label the agent does not export shows an empty panel, and
nothing else says so. `dashboard_problems` reads every panel target and every template query,
extracts the selectors (``metric{label="..."}``) and the grouping labels (``by (...)``,
``on (...)``, ...) with a small PromQL tokenizer, and compares them with `exported_series` of a
live registry, plus the labels the scraper adds (`PROMETHEUS_TARGET_LABELS`, and under the
prometheus-operator `KUBERNETES_TARGET_LABELS`)::

    assert dashboard_problems(json.load(f), agent_series()) == []

The tokenizer covers the PromQL dashboards use (selectors, functions, aggregations with
grouping, binary operators with matching, ranges, offsets, Grafana ``$variables``); anything
it cannot read is reported as a problem, never skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.registry import Collector

__all__ = [
    "KUBERNETES_TARGET_LABELS",
    "PROMETHEUS_TARGET_LABELS",
    "Query",
    "Selector",
    "agent_series",
    "dashboard_problems",
    "dashboard_queries",
    "exported_series",
    "parse_query",
]

PROMETHEUS_TARGET_LABELS = frozenset({"job", "instance"})
"""Labels Prometheus adds to every scraped series."""

KUBERNETES_TARGET_LABELS = PROMETHEUS_TARGET_LABELS | {"namespace", "pod", "service", "endpoint", "container"}
"""Labels a prometheus-operator ServiceMonitor adds besides."""

_GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "atan2"})
_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<number>(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?(?:ms|[smhdwy])?)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<variable>\$\{?[a-zA-Z_][a-zA-Z0-9_]*\}?)
  | (?P<matcher>=~|!~|!=|==|<=|>=|=)
  | (?P<punct>[(){},^*/%+\-<>@])
""", re.VERBOSE)


@dataclass(frozen=True)
class Selector:
    """One vector selector: the metric and the labels its matchers name."""

    metric: str
    labels: frozenset[str]


@dataclass(frozen=True)
class Query:
    """What one PromQL expression reads: its selectors and the labels it groups or matches on."""

    selectors: tuple[Selector, ...]
    grouping: frozenset[str]


def exported_series(registry: Collector) -> dict[str, frozenset[str]]:
    """Every sample name ``registry`` exports (``_bucket``, ``_sum``, ``_count`` of histograms
    included, the client's ``_created`` left out) with its label names."""
    series: dict[str, set[str]] = {}
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name != metric.name + "_created":
                series.setdefault(sample.name, set()).update(sample.labels)
    return {name: frozenset(labels) for name, labels in series.items()}


def agent_series() -> dict[str, frozenset[str]]:
    """`exported_series` of an agent's metrics once every happening has been seen (a labelled
    counter has no series before its first increment)."""
    from elastic.agent.observe.metrics import AgentMetrics

    metrics = AgentMetrics(run_id="run", node="node")
    metrics.round_joined(duration_s=0.2, members=2)
    metrics.worker_exit(exitcode=1)
    metrics.restart("worker_failure")
    metrics.set_nodes_waiting(1, 1)
    metrics.set_excluded(False)
    metrics.set_rendezvous_joined(None)
    return exported_series(metrics.registry)


def parse_query(expr: str) -> Query:
    """The selectors and grouping labels of PromQL ``expr``.

    Raises:
        ValueError: a character or construct the tokenizer does not know (names the position).
    """
    tokens = list(_tokens(expr))
    selectors: list[Selector] = []
    grouping: set[str] = set()
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        following = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if kind == "ident" and text in _GROUPING:
            labels, i = _label_list(tokens, i + 1, expr) if following == "(" else ([], i + 1)
            grouping.update(labels)
        elif kind == "ident" and (following == "(" or following in ("by", "without") or text in _KEYWORDS):
            i += 1  # a function, an aggregation (``sum by (x) (...)`` too) or an operator keyword
        elif kind == "ident":
            labels, i = _matchers(tokens, i + 2, expr) if following == "{" else ([], i + 1)
            selectors.append(Selector(text, frozenset(labels)))
        elif text == "{":
            raise ValueError(f"A selector without a metric name at {expr!r}: name the metric.")
        else:
            i += 1
    return Query(tuple(selectors), frozenset(grouping))


def dashboard_queries(dashboard: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    """``(where, expr, label)`` for every panel target and every template variable query;
    ``label`` is the label a ``label_values(selector, label)`` query reads ("" otherwise)."""
    for panel in dashboard.get("panels", ()):
        for target in panel.get("targets", ()):
            yield f"panel {panel.get('title')!r} target {target.get('refId')}", target["expr"], ""
    for variable in dashboard.get("templating", {}).get("list", ()):
        if variable.get("type") != "query":
            continue
        query = variable["query"]["query"] if isinstance(variable["query"], Mapping) else variable["query"]
        match = re.fullmatch(r"\s*label_values\((.*),\s*([a-zA-Z_]\w*)\s*\)\s*", query)
        if match is None:
            raise ValueError(f"Variable {variable['name']!r}: only label_values(selector, label) is supported.")
        yield f"variable {variable['name']!r}", match[1], match[2]


def dashboard_problems(dashboard: Mapping[str, Any], exported: Mapping[str, frozenset[str]],
                       target_labels: Iterable[str] = PROMETHEUS_TARGET_LABELS) -> list[str]:
    """Every place where ``dashboard`` names a metric or a label that is not exported (one line
    each; empty when all is well)."""
    added = frozenset(target_labels)
    problems: list[str] = []
    for where, expr, read_label in dashboard_queries(dashboard):
        try:
            query = parse_query(expr)
        except ValueError as error:
            problems.append(f"{where}: {error}")
            continue
        if not query.selectors:
            problems.append(f"{where}: no metric selector in {expr!r}")
        available: set[str] = set(added)
        for selector in query.selectors:
            if selector.metric not in exported:
                problems.append(f"{where}: {selector.metric} is not exported")
                continue
            labels = exported[selector.metric] | added
            available |= labels
            problems.extend(f"{where}: {selector.metric} has no label {label!r}"
                            for label in sorted(selector.labels - labels))
        problems.extend(f"{where}: groups by {label!r}, which no selected series has"
                        for label in sorted(query.grouping - available))
        if read_label and read_label not in available:
            problems.append(f"{where}: reads label {read_label!r}, which no selected series has")
    return problems


def _tokens(expr: str) -> Iterator[tuple[str, str]]:
    position = 0
    while position < len(expr):
        match = _TOKEN.match(expr, position)
        if match is None:
            raise ValueError(f"Cannot read {expr[position:position + 20]!r} at {position} of {expr!r}.")
        position = match.end()
        if match.lastgroup != "space":
            yield match.lastgroup or "", match.group()


def _label_list(tokens: list[tuple[str, str]], i: int, expr: str) -> tuple[list[str], int]:
    """The labels of ``( a, b )`` starting at ``tokens[i] == "("``; returns them and the index after ``)``."""
    labels: list[str] = []
    i += 1
    while i < len(tokens) and tokens[i][1] != ")":
        kind, text = tokens[i]
        if kind == "ident":
            labels.append(text)
        elif text != ",":
            raise ValueError(f"Unexpected {text!r} in a label list of {expr!r}.")
        i += 1
    return labels, i + 1


def _matchers(tokens: list[tuple[str, str]], i: int, expr: str) -> tuple[list[str], int]:
    """The label names of ``label op "value", ...}`` starting after ``{``; returns them and the
    index after ``}``."""
    labels: list[str] = []
    while i < len(tokens) and tokens[i][1] != "}":
        window = tokens[i:i + 3]
        if len(window) < 3 or window[0][0] != "ident" or window[1][0] != "matcher" or window[2][0] != "string":
            raise ValueError(f"Cannot read the label matchers of {expr!r}.")
        labels.append(window[0][1])
        i += 3
        if i < len(tokens) and tokens[i][1] == ",":
            i += 1
        elif i < len(tokens) and tokens[i][1] != "}":
            raise ValueError(f"Expected ',' or '}}' between the label matchers of {expr!r}.")
    return labels, i + 1
