"""The Grafana dashboards: the plain-Prometheus one in docs/ and the Helm chart's, checked against
the series a live agent registry exports (see support.dashboards)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from elastic.agent.observe.metrics import IDENTITY_LABELS, RESTARTS_TOTAL, AgentMetrics

from support.dashboards import (
    KUBERNETES_TARGET_LABELS,
    PROMETHEUS_TARGET_LABELS,
    Query,
    Selector,
    agent_series,
    dashboard_problems,
    dashboard_queries,
    exported_series,
    parse_query,
)

REPO = Path(__file__).resolve().parents[2]
PLAIN = REPO / "docs" / "grafana-dashboard.json"
CHART = REPO / "charts" / "etcd-elastic" / "files" / "dashboard.json"
NAMESPACE_MATCHER = 'namespace="$namespace", '


def sel(metric: str, *labels: str) -> Selector:
    return Selector(metric, frozenset(labels))


@pytest.mark.parametrize(("expr", "selectors", "grouping"), [
    ("up", [sel("up")], set()),
    ('max(elastic_members{run_id="$run_id", node=~"$node"})', [sel("elastic_members", "run_id", "node")], set()),
    ('sum by (cause) (increase(elastic_restarts_total{run_id="a"}[$__rate_interval]))',
     [sel("elastic_restarts_total", "run_id")], {"cause"}),
    ("histogram_quantile(0.95, sum(rate(x_bucket[5m])) by (le))", [sel("x_bucket")], {"le"}),
    ("a * on(namespace, pod) group_left(run_id) b{c!~'d'}", [sel("a"), sel("b", "c")], {"namespace", "pod", "run_id"}),
    ("rate(a[5m] offset 1h) > bool 0 and b unless c", [sel("a"), sel("b"), sel("c")], set()),
    ('count without (instance) (a{x="}{"})', [sel("a", "x")], {"instance"}),
    ("avg_over_time(a[1h:5m]) / 1e3 - -2.5", [sel("a")], set()),
])
def test_queries_give_their_selectors_and_grouping_labels(expr, selectors, grouping):
    assert parse_query(expr) == Query(tuple(selectors), frozenset(grouping))


@pytest.mark.parametrize("expr", ['{__name__="a"}', "a{b}", "a # comment", 'a{b="c" d="e"}'])
def test_what_the_reader_cannot_read_is_an_error_not_a_skip(expr):
    with pytest.raises(ValueError):
        parse_query(expr)


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_exported_series_lists_what_a_registry_exports_now():
    metrics = AgentMetrics(run_id="job1", node="n1")
    assert RESTARTS_TOTAL in exported_series(metrics.registry)  # every cause from the start
    assert "elastic_worker_exits_total" not in exported_series(metrics.registry)  # no exit yet
    metrics.worker_exit(exitcode=-9)
    assert exported_series(metrics.registry)["elastic_worker_exits_total"] == {"run_id", "node", "exitcode", "signal"}


def test_every_agent_series_carries_the_identity_labels():
    series = agent_series()
    assert "elastic_worker_exits_total" in series and "elastic_rendezvous_round_duration_seconds_bucket" in series
    assert {name: labels for name, labels in series.items() if not set(IDENTITY_LABELS) <= labels} == {}


def test_the_plain_prometheus_dashboard_reads_only_what_the_agent_exports():
    dashboard = load(PLAIN)
    assert dashboard_problems(dashboard, agent_series(), PROMETHEUS_TARGET_LABELS) == []
    exprs = [expr for _, expr, _ in dashboard_queries(dashboard)]
    assert not [expr for expr in exprs if "namespace" in expr or "pod" in expr], "Kubernetes labels in a plain dashboard"
    # Every panel selects the run by the agent's own labels, never through a join.
    panels = [expr for where, expr, _ in dashboard_queries(dashboard) if where.startswith("panel")]
    assert panels and all('run_id="$run_id"' in expr and 'node=~"$node"' in expr for expr in panels)
    assert not [expr for expr in panels if "group_left" in expr or " on(" in expr]
    used = {s.metric for expr in panels for s in parse_query(expr).selectors}
    assert {"elastic_members", "elastic_rendezvous_rounds_total", "elastic_restarts_total",
            "elastic_worker_exits_total", "elastic_store_outage_seconds"} <= used


def test_a_dashboard_naming_a_missing_metric_or_label_is_caught():
    broken = copy.deepcopy(load(PLAIN))
    broken["panels"][0]["targets"][0]["expr"] = 'max(elastic_membrs{run_id="$run_id"})'
    broken["panels"][1]["targets"][0]["expr"] = 'max by (pod) (elastic_rendezvous_rounds_total{host="x"})'
    problems = dashboard_problems(broken, agent_series(), PROMETHEUS_TARGET_LABELS)
    assert len(problems) == 3, problems
    assert "elastic_membrs is not exported" in problems[0]
    assert "no label 'host'" in problems[1] and "groups by 'pod'" in problems[2]


def test_the_helm_charts_dashboard_is_the_plain_one_filtered_by_namespace():
    chart, plain = load(CHART), load(PLAIN)
    assert dashboard_problems(chart, agent_series(), KUBERNETES_TARGET_LABELS) == []
    panels = [expr for where, expr, _ in dashboard_queries(chart) if where.startswith("panel")]
    assert all(NAMESPACE_MATCHER in expr for expr in panels)

    def without_namespace(dashboard: dict) -> dict:
        text = json.dumps(dashboard["panels"]).replace(NAMESPACE_MATCHER.replace('"', '\\"'), "")
        return json.loads(text)

    assert without_namespace(chart) == plain["panels"]
    chart_variables = [v["name"] for v in chart["templating"]["list"]]
    assert chart_variables == ["datasource", "namespace", *[v["name"] for v in plain["templating"]["list"]][1:]]
