"""Rendezvous settings: torch's option names, defaults, and sentences for bad values."""

import pytest

from elastic.rendezvous.errors import RendezvousConfigError
from elastic.rendezvous.settings import RendezvousSettings, parse_rdzv_conf, settings_from_conf


def test_defaults_match_torch():
    settings = RendezvousSettings("job", 1, 4)
    assert (settings.join_timeout, settings.last_call_timeout, settings.close_timeout) == (600, 30, 30)
    assert settings.lease_ttl >= 2 and settings.elastic


def test_rdzv_conf_parses_torch_names_and_backend_options():
    conf = parse_rdzv_conf(["join_timeout=900,last-call-timeout=5", "cacert=/ca.pem,lease_ttl=3"])
    settings = settings_from_conf("job", 2, 2, conf)
    assert settings.join_timeout == 900 and settings.last_call_timeout == 5 and settings.lease_ttl == 3
    assert settings.backend_options == {"cacert": "/ca.pem"}


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
        ({"lease_ttl": 1}, "at least 2 seconds"),
        ({"namespace": "elastic"}, "namespace"),
    ],
)
def test_bad_settings_raise_sentences(kwargs, says):
    values = {"run_id": "job", "min_nodes": 1, "max_nodes": 2, **kwargs}
    with pytest.raises(RendezvousConfigError, match=says):
        RendezvousSettings(**values)


@pytest.mark.parametrize("text", ["join_timeout", "=5", "join_timeout=abc", "join_timeout=-3"])
def test_malformed_rdzv_conf_is_rejected(text):
    with pytest.raises(RendezvousConfigError):
        settings_from_conf("job", 1, 1, parse_rdzv_conf(text))
