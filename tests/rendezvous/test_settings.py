"""Rendezvous settings: torch's option names, defaults, and sentences for bad values."""

import pytest

from elastic.rendezvous.errors import RendezvousConfigError
from elastic.rendezvous.conf import parse_rdzv_conf
from elastic.rendezvous.settings import RendezvousSettings, settings_from_conf


def test_defaults_match_torch():
    settings = RendezvousSettings("job", 1, 4)
    assert (settings.join_timeout, settings.last_call_timeout, settings.close_timeout) == (600, 30, 30)
    assert settings.lease_ttl >= 2 and settings.elastic


def test_rdzv_conf_parses_torch_names_and_accepts_backend_options_without_reading_them():
    conf = parse_rdzv_conf(["join_timeout=900,last-call-timeout=5", "cacert=/ca.pem,lease_ttl=3"])
    settings = settings_from_conf("job", 2, 2, conf)
    assert settings == RendezvousSettings("job", 2, 2, join_timeout=900, last_call_timeout=5, lease_ttl=3)


@pytest.mark.parametrize("conf, expected", [
    ({}, {}),
    ({"close_timeout": "7", "exclusion_cooldown": "8", "store_outage_timeout": "9"},
     {"close_timeout": 7, "exclusion_cooldown": 8, "store_outage_timeout": 9}),
    ({"max_node_failures": "3"}, {"max_node_failures": 3}),
    ({"rejoin_timeout": "0.3"}, {"rejoin_timeout": 0.3}),
    ({"namespace": "team/a/"}, {"namespace": "/team/a"}),
    ({"etcd_prefix": "/torch"}, {"namespace": "/torch"}),
    ({"namespace": "/ours", "etcd_prefix": "/torch"}, {"namespace": "/ours"}),
    ({"keep_alive_interval": "0.5"}, {"lease_ttl": 2.0}),  # 0.5 x 3 is below etcd's minimum
    ({"keep_alive_max_attempt": "4"}, {"lease_ttl": 20.0}),  # torch's 5 s interval
    ({"lease_ttl": "3", "keep_alive_interval": "9"}, {"lease_ttl": 3.0}),
    ({"heartbeat": "whatever"}, {}),  # accepted, no effect: liveness is the lease
])
def test_each_engine_key_sets_its_setting(conf, expected):
    assert settings_from_conf("job", 1, 2, conf) == RendezvousSettings("job", 1, 2, **expected)


def test_torch_keepalive_options_set_the_lease_ttl():
    settings = settings_from_conf("job", 1, 1, {"keep_alive_interval": "2", "keep_alive_max_attempt": "4"})
    assert settings.lease_ttl == 8


def test_unknown_options_are_named_with_the_valid_ones():
    with pytest.raises(RendezvousConfigError) as raised:
        settings_from_conf("job", 1, 1, {"join_timout": "5"})
    assert "join_timout" in str(raised.value) and "join_timeout" in str(raised.value)


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"run_id": ""}, "run id"),
        ({"run_id": "a/b"}, "run id"),
        ({"run_id": "."}, "plain name"),
        ({"run_id": ".."}, "plain name"),
        ({"min_nodes": 0}, "minimum number of nodes"),
        ({"max_nodes": 1, "min_nodes": 2}, "maximum number of nodes"),
        ({"join_timeout": -1}, "join timeout"),
        ({"rejoin_timeout": 0.0}, "rejoin timeout"),
        ({"rejoin_timeout": float("nan")}, "rejoin timeout"),
        ({"lease_ttl": 1}, "at least 2 seconds"),
        ({"namespace": "elastic"}, "namespace"),
    ],
)
def test_bad_settings_raise_sentences(kwargs, says):
    values = {"run_id": "job", "min_nodes": 1, "max_nodes": 2, **kwargs}
    with pytest.raises(RendezvousConfigError, match=says):
        RendezvousSettings(**values)


@pytest.mark.parametrize("text", ["join_timeout", "=5", "join_timeout=abc", "join_timeout=-3", "join_timeout=inf",
                                  "max_node_failures=-1", "max_node_failures=1", "lease_ttl=1",
                                  "rejoin_timeout=0", "rejoin_timeout=-1"])
def test_malformed_rdzv_conf_is_rejected(text):
    with pytest.raises(RendezvousConfigError):
        settings_from_conf("job", 1, 1, parse_rdzv_conf(text))
