"""Finding 5: credentials in an endpoint are refused without being echoed, and a password sent
over plain http is warned about."""

from __future__ import annotations

import logging

import pytest

from backends.endpoints import parse_endpoint, parse_endpoints
from backends.errors import EndpointError
from backends.etcd.config import EtcdConfig
from elastic.rendezvous.errors import RendezvousConfigError
from elastic.rendezvous.backend_spec import etcd_endpoints


@pytest.mark.parametrize("text", [
    "http://alice:secret@host:2379",
    "https://alice:secret@etcd-0.etcd:2379",
    "alice:secret@127.0.0.1:2379",
    "http://alice:se@cr@et@[::1]:2379",
])
def test_an_endpoint_with_user_info_is_refused_and_the_password_redacted(text):
    with pytest.raises(EndpointError) as caught:
        parse_endpoint(text, 2379)
    message = str(caught.value)
    assert "secret" not in message and "se@cr" not in message and "alice" not in message
    assert "***@" in message and "user=" in message and "password_file=" in message
    assert "IPv6" not in message


def test_a_list_with_one_credentialed_endpoint_is_refused_redacted():
    with pytest.raises(EndpointError) as caught:
        parse_endpoints("etcd-0:2379,http://bob:hunter2@etcd-1:2379", 2379)
    assert "hunter2" not in str(caught.value)


def test_the_rendezvous_flags_refuse_user_info_redacted():
    with pytest.raises(RendezvousConfigError) as caught:
        etcd_endpoints("http://alice:secret@127.0.0.1:1")
    assert "secret" not in str(caught.value) and "password_file=" in str(caught.value)


def test_a_password_over_plain_http_is_warned_about_and_one_over_https_is_not(caplog):
    with caplog.at_level(logging.WARNING, logger="backends.etcd.config"):
        EtcdConfig(endpoints="https://127.0.0.1:2379", user="alice", password="secret")
        EtcdConfig(endpoints="http://127.0.0.1:2379")
        EtcdConfig(endpoints="http://127.0.0.1:2379", user="alice", password="secret")
    (warning,) = caplog.records
    assert "plain http" in warning.getMessage() and "https" in warning.getMessage()
    assert "secret" not in warning.getMessage()
