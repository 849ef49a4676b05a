"""The agent's metrics (prometheus_client, one registry per agent), their exposition, and the
/metrics + /healthz server."""

from __future__ import annotations

import json
import re
import socket
import threading
import urllib.error
import urllib.request

import pytest

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY

from elastic.agent.observe.metrics import (
    AGENT_INFO,
    EXCLUDED,
    MEMBERS,
    NODES_WAITING,
    RENDEZVOUS_JOINED_NODES,
    RESTARTS_TOTAL,
    ROUND_DURATION_BUCKETS,
    ROUND_DURATION_SECONDS,
    ROUNDS_TOTAL,
    SPARES,
    STORE_NOSPACE,
    STORE_OUTAGE_SECONDS,
    WORKER_EXITS_TOTAL,
    WORKERS,
    AgentMetrics,
    render,
)
from elastic.agent.observe.metrics_server import MetricsServer, MetricsServerError

TIMEOUT = 5


# -- a tiny parser for the text exposition format 0.0.4 --------------------------------------
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)\Z")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|\Z)')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse_exposition(text: str) -> dict[str, dict]:
    """{family: {"help", "type", "samples": {(name, sorted label pairs): value}}}; asserts the
    format's rules (HELP and TYPE before samples, sample names belong to their family)."""
    assert text.endswith("\n")
    families: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            assert name not in families, f"family {name} described twice"
            current = families[name] = {"help": help_text, "type": None, "samples": {}}
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert current is families.get(name) and kind in {"counter", "gauge", "histogram"}
            current["type"] = kind
        else:
            match = _SAMPLE.match(line)
            assert match, f"not a sample line: {line!r}"
            name, labels_text, value = match.groups()
            assert current is not None and current["type"] is not None
            family = next(n for n, f in families.items() if f is current)
            allowed = {family} | (
                {f"{family}_bucket", f"{family}_sum", f"{family}_count"}
                if current["type"] == "histogram" else set()
            )
            assert name in allowed, f"{name} does not belong to {family}"
            current["samples"][(name, _parse_labels(labels_text or ""))] = float(value)
    return families


def _parse_labels(text: str) -> tuple[tuple[str, str], ...]:
    pairs, position = [], 0
    while position < len(text):
        match = _LABEL.match(text, position)
        assert match, f"bad labels at {text[position:]!r}"
        value = re.sub(r"\\.", lambda m: _UNESCAPE[m.group()], match.group(2))
        pairs.append((match.group(1), value))
        position = match.end()
    return tuple(sorted(pairs))


ID = {"run_id": "job1", "node": "host-a"}  # the agent_metrics fixture's identity labels


def sample(families, name, family=None, ids=ID, **labels) -> float:
    return families[family or name]["samples"][(name, tuple(sorted({**ids, **labels}.items())))]


# -- HTTP helpers -------------------------------------------------------------------------------
def http_get(url: str) -> tuple[int, dict, str]:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, dict(e.headers), e.read().decode()


@pytest.fixture
def health_state():
    return {"healthy": True, "reason": "running 2 workers"}


@pytest.fixture
def agent_metrics():
    return AgentMetrics(run_id="job1", node="host-a")


@pytest.fixture
def server(agent_metrics, health_state):
    server = MetricsServer(
        0, "127.0.0.1", registry=agent_metrics.registry,
        health=lambda: (health_state["healthy"], health_state["reason"]),
    ).start()
    try:
        yield server
    finally:
        server.stop()


# -- the agent's metrics ------------------------------------------------------------------------
def test_two_agents_in_one_process_keep_separate_metrics():
    first = AgentMetrics(run_id="job1", node="host-a")
    second = AgentMetrics(run_id="job1", node="host-b")
    first.round_joined(duration_s=0.1, members=2)

    assert sample(parse_exposition(render(first.registry).decode()), ROUNDS_TOTAL) == 1
    assert sample(parse_exposition(render(second.registry).decode()), ROUNDS_TOTAL, ids={**ID, "node": "host-b"}) == 0
    assert first.registry is not REGISTRY and second.registry is not REGISTRY
    assert REGISTRY.get_sample_value(ROUNDS_TOTAL) is None


def test_registering_the_agent_metrics_twice_in_one_registry_is_refused(agent_metrics):
    with pytest.raises(ValueError, match="Duplicated"):
        AgentMetrics(run_id="job1", node="host-a", registry=agent_metrics.registry)


def test_run_ids_with_quotes_backslashes_and_newlines_are_escaped():
    tricky = 'a "quoted" back\\slash\nnewline'
    metrics = AgentMetrics(run_id=tricky, node="host-a")

    families = parse_exposition(render(metrics.registry).decode())

    assert sample(families, "elastic_agent_info", run_id=tricky, node="host-a") == 1


def test_only_the_documented_series_are_exported_without_created_timestamps(agent_metrics):
    agent_metrics.round_joined(duration_s=0.3, members=2)
    agent_metrics.worker_exit(exitcode=1)

    families = parse_exposition(render(agent_metrics.registry).decode())

    documented = {AGENT_INFO, ROUNDS_TOTAL, ROUND_DURATION_SECONDS, MEMBERS, NODES_WAITING, SPARES,
                  EXCLUDED, RENDEZVOUS_JOINED_NODES, RESTARTS_TOTAL, WORKERS, WORKER_EXITS_TOTAL,
                  STORE_OUTAGE_SECONDS, STORE_NOSPACE}
    assert set(families) == documented
    assert not [name for f in families.values() for (name, _) in f["samples"] if name.endswith("_created")]


def test_every_series_carries_the_run_id_and_the_node_id(agent_metrics):
    agent_metrics.round_joined(duration_s=0.3, members=2)
    agent_metrics.worker_exit(exitcode=-9)
    agent_metrics.restart("worker_failure")

    families = parse_exposition(render(agent_metrics.registry).decode())

    series = [labels for family in families.values() for (_, labels) in family["samples"]]
    assert len(series) > len(families)
    assert [labels for labels in series if not {("run_id", "job1"), ("node", "host-a")} <= set(labels)] == []


def test_exclusion_sets_and_clears_its_gauge(agent_metrics):
    agent_metrics.set_excluded(True)
    assert sample(parse_exposition(render(agent_metrics.registry).decode()), EXCLUDED) == 1
    agent_metrics.set_excluded(False)
    assert sample(parse_exposition(render(agent_metrics.registry).decode()), EXCLUDED) == 0


def test_agent_metrics_export_every_documented_series_from_the_start(agent_metrics):
    families = parse_exposition(render(agent_metrics.registry).decode())

    assert sample(families, "elastic_agent_info", run_id="job1", node="host-a") == 1
    assert sample(families, ROUNDS_TOTAL) == 0
    assert sample(families, f"{ROUND_DURATION_SECONDS}_count", ROUND_DURATION_SECONDS) == 0
    assert sample(families, MEMBERS) == 0
    assert sample(families, NODES_WAITING) == 0
    for cause in ("worker_failure", "membership_change", "store_outage"):
        assert sample(families, RESTARTS_TOTAL, cause=cause) == 0
    for state in ("running", "succeeded", "failed"):
        assert sample(families, WORKERS, state=state) == 0
    assert families[WORKER_EXITS_TOTAL]["type"] == "counter"


def test_agent_metrics_follow_rounds_restarts_and_worker_exits(agent_metrics):
    agent_metrics.round_joined(duration_s=0.3, members=2)
    agent_metrics.round_joined(duration_s=45.0, members=3)
    agent_metrics.set_nodes_waiting(1)
    agent_metrics.restart("membership_change")
    agent_metrics.restart("worker_failure")
    agent_metrics.restart("worker_failure")
    agent_metrics.set_workers(running=1, succeeded=2, failed=1)
    agent_metrics.worker_exit(exitcode=0)
    agent_metrics.worker_exit(exitcode=1)
    agent_metrics.worker_exit(exitcode=-9)  # as subprocess reports SIGKILL
    agent_metrics.worker_exit(exitcode=None, signal="SIGTERM")

    families = parse_exposition(render(agent_metrics.registry).decode())

    assert sample(families, ROUNDS_TOTAL) == 2
    bucket = f"{ROUND_DURATION_SECONDS}_bucket"
    assert sample(families, bucket, ROUND_DURATION_SECONDS, le="0.5") == 1
    assert sample(families, bucket, ROUND_DURATION_SECONDS, le="60.0") == 2
    assert len(families[ROUND_DURATION_SECONDS]["samples"]) == len(ROUND_DURATION_BUCKETS) + 3
    assert sample(families, MEMBERS) == 3
    assert sample(families, NODES_WAITING) == 1
    assert sample(families, RESTARTS_TOTAL, cause="worker_failure") == 2
    assert sample(families, RESTARTS_TOTAL, cause="membership_change") == 1
    assert sample(families, WORKERS, state="succeeded") == 2
    assert sample(families, WORKER_EXITS_TOTAL, exitcode="0", signal="") == 1
    assert sample(families, WORKER_EXITS_TOTAL, exitcode="1", signal="") == 1
    assert sample(families, WORKER_EXITS_TOTAL, exitcode="", signal="SIGKILL") == 1
    assert sample(families, WORKER_EXITS_TOTAL, exitcode="", signal="SIGTERM") == 1


def test_the_store_outage_gauge_is_read_from_its_source_at_each_scrape(agent_metrics):
    assert sample(parse_exposition(render(agent_metrics.registry).decode()), STORE_OUTAGE_SECONDS) == 0
    outage = [0.0]
    agent_metrics.watch_store_outage(lambda: outage[0])
    outage[0] = 12.5
    assert sample(parse_exposition(render(agent_metrics.registry).decode()), STORE_OUTAGE_SECONDS) == 12.5
    outage[0] = 0.0
    assert sample(parse_exposition(render(agent_metrics.registry).decode()), STORE_OUTAGE_SECONDS) == 0


def test_the_store_nospace_gauge_is_read_from_its_source_at_each_scrape(agent_metrics):
    assert sample(parse_exposition(render(agent_metrics.registry).decode()), STORE_NOSPACE) == 0
    full = [True]
    agent_metrics.watch_store_full(lambda: full[0])
    assert sample(parse_exposition(render(agent_metrics.registry).decode()), STORE_NOSPACE) == 1
    full[0] = False
    assert sample(parse_exposition(render(agent_metrics.registry).decode()), STORE_NOSPACE) == 0


def test_an_unknown_restart_cause_is_rejected(agent_metrics):
    with pytest.raises(ValueError):
        agent_metrics.restart("oom")


# -- the server ---------------------------------------------------------------------------------
def test_metrics_are_served_as_exposition_text_on_a_free_port(server, agent_metrics):
    agent_metrics.round_joined(duration_s=0.3, members=2)

    status, headers, body = http_get(f"http://127.0.0.1:{server.port}/metrics")

    assert server.port > 0
    assert status == 200
    assert headers["Content-Type"] == CONTENT_TYPE_LATEST
    assert sample(parse_exposition(body), MEMBERS) == 2


def test_healthz_flips_to_503_with_the_reason_and_back(server, health_state):
    url = f"{server.url}/healthz"
    status, headers, body = http_get(url)
    assert (status, json.loads(body)) == (200, {"status": "ok", "reason": "running 2 workers"})
    assert headers["Content-Type"] == "application/json"

    health_state.update(healthy=False, reason="rendezvous lost: lease expired")
    status, _, body = http_get(url)
    assert status == 503
    assert json.loads(body) == {"status": "unhealthy", "reason": "rendezvous lost: lease expired"}

    health_state.update(healthy=True, reason="ok")
    assert http_get(url)[0] == 200


def test_a_health_check_that_raises_reports_503_and_the_server_keeps_serving(agent_metrics):
    def broken() -> tuple[bool, str]:
        raise RuntimeError("boom")

    with MetricsServer(0, "127.0.0.1", registry=agent_metrics.registry, health=broken) as server:
        status, _, body = http_get(f"{server.url}/healthz")
        assert status == 503 and "boom" in json.loads(body)["reason"]
        assert http_get(f"{server.url}/metrics")[0] == 200


def test_other_paths_are_not_found(server):
    assert http_get(f"{server.url}/")[0] == 404
    assert http_get(f"{server.url}/metrics/extra")[0] == 404
    assert http_get(f"{server.url}/metrics?format=text")[0] == 200


def test_concurrent_scrapes_during_updates_all_parse(server, agent_metrics):
    stop = threading.Event()

    def update() -> None:
        while not stop.is_set():
            agent_metrics.worker_exit(exitcode=1)
            agent_metrics.round_joined(duration_s=0.1, members=2)

    updater = threading.Thread(target=update)
    updater.start()
    try:
        results: list[int] = []

        def scrape() -> None:
            for _ in range(10):
                status, _, body = http_get(f"{server.url}/metrics")
                parse_exposition(body)
                results.append(status)

        scrapers = [threading.Thread(target=scrape) for _ in range(4)]
        for t in scrapers:
            t.start()
        for t in scrapers:
            t.join(timeout=30)
    finally:
        stop.set()
        updater.join(timeout=10)
    assert results == [200] * 40


def test_a_port_in_use_is_a_clear_error_naming_the_port_and_the_flag(agent_metrics):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = MetricsServer(port, "127.0.0.1", registry=agent_metrics.registry)
        with pytest.raises(MetricsServerError, match=f"{port}.*--metrics-port"):
            server.start()
        server.stop()


def test_stop_frees_the_port_and_is_idempotent(agent_metrics):
    server = MetricsServer(0, "127.0.0.1", registry=agent_metrics.registry).start()
    port = server.port
    server.stop()
    server.stop()

    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=TIMEOUT)
    with MetricsServer(port, "127.0.0.1", registry=agent_metrics.registry) as again:
        assert http_get(f"{again.url}/healthz")[0] == 200


def test_stop_before_start_is_harmless_and_a_stopped_server_cannot_restart(agent_metrics):
    server = MetricsServer(0, registry=agent_metrics.registry)
    server.stop()
    with pytest.raises(RuntimeError):
        server.start()


@pytest.mark.parametrize("port", [-1, 65536])
def test_an_out_of_range_port_is_rejected(agent_metrics, port):
    with pytest.raises(ValueError, match="metrics port"):
        MetricsServer(port, registry=agent_metrics.registry)


def test_the_server_thread_is_a_daemon_and_ends_on_stop(agent_metrics):
    with MetricsServer(0, "127.0.0.1", registry=agent_metrics.registry) as server:
        [thread] = [t for t in threading.enumerate() if t.name == f"metrics-server:{server.port}"]
        assert thread.daemon
    thread.join(timeout=TIMEOUT)
    assert not thread.is_alive()


def snapshot(joined: int | None):
    from elastic.rendezvous.progress import WaitSnapshot

    return None if joined is None else WaitSnapshot(run_id="r", node_id="n", round=1, joined=joined, min_nodes=2,
                                                    max_nodes=2, expected=None, seconds_left=60.0)


@pytest.mark.parametrize(
    ("healthy", "joined", "spares", "outage", "expected"),
    [
        (True, None, 0, 0.0, (True, "running")),
        (True, None, 0, "full", (True, "running; store out of space")),
        (True, 1, 0, "full", (True, "waiting for rendezvous (1 of 2); store out of space")),
        (True, None, 2, 0.0, (True, "running; spares: 2")),
        (True, None, 0, 7.4, (True, "running; store unreachable for 7s")),
        (True, None, 1, 30.0, (True, "running; spares: 1; store unreachable for 30s")),
        (True, 1, 0, 0.0, (True, "waiting for rendezvous (1 of 2)")),
        (True, 1, 0, 12.0, (True, "waiting for rendezvous (1 of 2); store unreachable for 12s")),
        (False, None, 0, 12.0, (False, "stopped")),
    ],
)
def test_healthz_says_an_outage_but_stays_healthy(healthy, joined, spares, outage, expected):
    from elastic.agent.observe.standing import Standing, health
    from elastic.rendezvous.api import MembershipStatus

    full = outage == "full"
    membership = MembershipStatus(spares=spares, store_outage=0.0 if full else outage, store_full=full)
    assert health(Standing(healthy, snapshot(joined), 2, membership)) == expected


@pytest.mark.parametrize(
    ("healthy", "joined", "members", "waiting", "spares", "expected"),
    [
        (True, None, 0, 0, 0, (0, 0, 0, 0)),  # before the first round
        (True, None, 3, 1, 0, (3, 1, 0, 0)),  # running, a node waits to join
        (True, None, 4, 0, 2, (4, 0, 2, 0)),  # running, full, two spares
        (True, 1, 2, 1, 2, (0, 0, 0, 1)),  # waiting for a rendezvous: no round runs here
        (True, 0, 2, 0, 0, (0, 0, 0, 0)),
        (False, 1, 2, 1, 1, (0, 0, 0, 0)),  # stopped
    ],
)
def test_the_membership_gauges_say_what_healthz_says(healthy, joined, members, waiting, spares, expected):
    from elastic.agent.observe.standing import MembershipGauges, Standing, gauges
    from elastic.rendezvous.api import MembershipStatus

    standing = Standing(healthy, snapshot(joined), members, MembershipStatus(waiting=waiting, spares=spares))
    assert gauges(standing) == MembershipGauges(*expected)


def test_followed_gauges_are_read_from_the_look_at_each_scrape(agent_metrics):
    from elastic.agent.observe.standing import Standing
    from elastic.rendezvous.api import MembershipStatus

    looks = [Standing(True, None, 2, MembershipStatus(waiting=1, spares=1))]
    agent_metrics.round_joined(duration_s=0.1, members=2)
    agent_metrics.follow(lambda: looks[-1])
    agent_metrics.set_nodes_waiting(5, 5)  # no effect once followed
    names = (MEMBERS, NODES_WAITING, SPARES, RENDEZVOUS_JOINED_NODES)

    def scraped() -> tuple[float, ...]:
        families = parse_exposition(render(agent_metrics.registry).decode())
        return tuple(sample(families, name) for name in names)

    assert scraped() == (2, 1, 1, 0)
    looks.append(Standing(True, snapshot(1), 2, MembershipStatus()))  # the next rendezvous: waiting
    assert scraped() == (0, 0, 0, 1)
