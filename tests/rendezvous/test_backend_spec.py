"""Backend specs: the connection keys of --rdzv-conf parsed once into typed values, secrets kept out
of reprs, and the registry building handlers from specs (no backend is contacted here)."""

from __future__ import annotations

import pytest

from backends.endpoints import Endpoint
from elastic.rendezvous.backend_spec import (
    DEFAULT_MAX_RESPONSE_BYTES, ETCD_TIMEOUTS, STORE_TIMEOUTS, ClientCertificate, EtcdCredentials, EtcdSpec, Hosting,
    Secret, SecretFile, StandaloneSpec, StaticSpec, StoreSpec, Timeouts, etcd_endpoints, spec_from_conf,
    standalone_spec, store_endpoint,
)
from elastic.rendezvous.conf import ConfValues, check_known_keys, parse_rdzv_conf
from elastic.rendezvous.errors import RendezvousConfigError
from elastic.rendezvous.registry import create_handler
from elastic.rendezvous.settings import RendezvousSettings

ETCD0 = (Endpoint("etcd-0", 2379),)


# -- values --------------------------------------------------------------------------------------


@pytest.mark.parametrize("reader, text, expected", [
    ("seconds", "2.5", 2.5), ("seconds", "1e3", 1000.0),
    ("switch", "1", True), ("switch", "TRUE", True), ("switch", " on ", True), ("switch", "yes", True),
    ("switch", "0", False), ("switch", "false", False), ("switch", "Off", False), ("switch", "no", False),
    ("choice", "HTTPS", "https"),
])
def test_conf_readers_take_their_forms(reader, text, expected):
    values = ConfValues({"k": text})
    read = getattr(values, reader)
    assert (read("k", ("http", "https")) if reader == "choice" else read("k")) == expected


@pytest.mark.parametrize("reader, text, says", [
    ("seconds", "soon", "k='soon' must be a number of seconds."),
    ("seconds", "0", "k='0' must be a positive number."),
    ("seconds", "-1", "must be a positive number"),
    ("seconds", "inf", "must be a positive number"),
    ("seconds", "nan", "must be a positive number"),
    ("switch", "maybe", "k='maybe' must be 1 or 0 (true or false)."),
    ("switch", "", "must be 1 or 0"),
    ("choice", "ftp", "k='ftp' must be one of http, https."),
    ("whole", "1.5", "k='1.5' must be a whole number >= 1."),
    ("whole", "0", "must be a whole number >= 1"),
    ("seconds", "x" * 300, "k='" + "x" * 100 + "' must"),  # a long value is cut in the message
])
def test_conf_readers_refuse_other_forms_in_one_line_naming_key_and_value(reader, text, says):
    values = ConfValues({"k": text})
    arguments = {"choice": (("http", "https"),), "whole": (1, "a whole number >= 1")}.get(reader, ())
    with pytest.raises(RendezvousConfigError) as raised:
        getattr(values, reader)("k", *arguments)
    assert says in str(raised.value) and "\n" not in str(raised.value)


def test_absent_keys_read_as_none():
    values = ConfValues({})
    assert values.seconds("k") is values.switch("k") is values.choice("k", ("a",)) is values.whole("k", 0, "") is None


def test_rdzv_conf_text_merges_with_later_keys_winning_and_unknown_keys_are_named():
    assert parse_rdzv_conf(["a-b=1, c=2", "a_b=3,,"]) == {"a_b": "3", "c": "2"}
    with pytest.raises(RendezvousConfigError, match="bogus.*valid options are: .*join_timeout"):
        check_known_keys({"bogus": "1", "join_timeout": "1"})


# -- etcd ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("conf, expected", [
    ({}, EtcdSpec("etcd", ETCD0)),
    ({"cacert": "/ca"}, EtcdSpec("etcd", ETCD0, ca_cert="/ca")),
    ({"cert": "/c", "key": "/k"}, EtcdSpec("etcd", ETCD0, client_certificate=ClientCertificate("/c", "/k"))),
    ({"user": "u", "password": "p"}, EtcdSpec("etcd", ETCD0, credentials=EtcdCredentials("u", Secret("password", "p")))),
    ({"user": "u", "password_file": "/f"},
     EtcdSpec("etcd", ETCD0, credentials=EtcdCredentials("u", SecretFile("password_file", "/f")))),
    ({"user": "u", "password": "p", "password_file": "/f"},  # inline wins, as before
     EtcdSpec("etcd", ETCD0, credentials=EtcdCredentials("u", Secret("password", "p")))),
    ({"dial_timeout": "1", "request_timeout": "2"}, EtcdSpec("etcd", ETCD0, timeouts=Timeouts(1, 2))),
    ({"request_timeout": "2", "read_timeout": "3"}, EtcdSpec("etcd", ETCD0, timeouts=Timeouts(5, 3))),
    ({"max_response_bytes": "4096"}, EtcdSpec("etcd", ETCD0, max_response_bytes=4096)),
    ({"etcd_transport": " GRPCIO "}, EtcdSpec("etcd", ETCD0)),
    ({"protocol": "https"}, EtcdSpec("etcd", (Endpoint("etcd-0", 2379, "https"),))),
    ({"protocol": "http"}, EtcdSpec("etcd", ETCD0)),
    ({"token": "t", "is_host": "1", "store_type": "tcp", "heartbeat": "9"}, EtcdSpec("etcd", ETCD0)),  # not etcd's
])
def test_etcd_options_become_typed_fields(conf, expected):
    assert spec_from_conf("etcd", "etcd-0", conf) == expected


@pytest.mark.parametrize("conf, says", [
    ({"etcd_transport": "builtin"}, "etcd_transport=builtin was removed: the etcd client always uses grpcio"),
    ({"user": "u"}, "etcd user 'u' was given without a password"),
    ({"password": "p"}, "password was given without a user name"),
    ({"user": "", "password": "p"}, "password was given without a user name"),
    ({"key": "/k"}, "needs its key and a key needs its certificate"),
    ({"max_response_bytes": "0"}, "max_response_bytes='0' must be a whole number of bytes >= 1"),
    ({"dial_timeout": "0"}, "dial_timeout='0' must be a positive number"),
    ({"read_timeout": "x"}, "read_timeout='x' must be a number of seconds"),
    ({"protocol": "tls"}, "protocol='tls' must be one of http, https"),
])
def test_bad_etcd_options_are_one_line_naming_the_option(conf, says):
    with pytest.raises(RendezvousConfigError) as raised:
        spec_from_conf("etcd-v3", "etcd-0", conf)
    assert says in str(raised.value) and "\n" not in str(raised.value)


def test_the_password_is_never_in_a_repr_or_the_spec_text():
    spec = spec_from_conf("etcd", "etcd-0", {"user": "alice", "password": "hunter2"})
    assert "hunter2" not in repr(spec) and "hunter2" not in spec.conf_text()
    assert "user=alice,password=***" in spec.conf_text()
    assert "hunter2" not in repr(StandaloneSpec().hosted_at(Endpoint("127.0.0.1", 1), "hunter2"))


def test_a_secret_file_is_read_when_used_so_a_rotated_file_is_picked_up(tmp_path):
    path = tmp_path / "password"
    path.write_text("first\n")
    secret = SecretFile("password_file", str(path))
    assert secret.read() == "first"
    path.write_text("second")
    assert secret.read() == "second"
    with pytest.raises(RendezvousConfigError, match=r"Cannot read password_file '.*missing'"):
        SecretFile("password_file", str(tmp_path / "missing")).read()


@pytest.mark.parametrize("text, expected", [
    ("e0", (Endpoint("e0", 2379),)),
    ("e0:1,https://e1", (Endpoint("e0", 1), Endpoint("e1", 2379, "https"))),
    ("[::1]:2", (Endpoint("::1", 2),)),
    ("unix:///run/etcd.sock", (Endpoint("/run/etcd.sock", 0, "unix"),)),
])
def test_etcd_endpoints_parse_into_endpoints(text, expected):
    assert etcd_endpoints(text) == expected


@pytest.mark.parametrize("text, says", [
    ("", "No endpoint given"), ("e:99999", "has port '99999'"), ("http://bob:hunter2@e:1", "***@"),
])
def test_bad_etcd_endpoints_are_config_errors(text, says):
    with pytest.raises(RendezvousConfigError) as raised:
        etcd_endpoints(text)
    assert says in str(raised.value) and "hunter2" not in str(raised.value)


# -- the built-in store --------------------------------------------------------------------------


@pytest.mark.parametrize("name, conf, expected", [
    ("tcp", {}, StoreSpec("tcp", Endpoint("n", 29400))),
    ("tcp", {"is_host": "1", "insecure_open_store": "1"}, StoreSpec("tcp", Endpoint("n", 29400))),  # tcp only connects
    ("c10d", {}, StoreSpec("c10d", Endpoint("n", 29400), hosting=Hosting.BY_ADDRESS)),
    ("c10d", {"is_host": "true"}, StoreSpec("c10d", Endpoint("n", 29400), hosting=Hosting.HOST)),
    ("c10d", {"is_host": "0"}, StoreSpec("c10d", Endpoint("n", 29400), hosting=Hosting.CONNECT)),
    ("c10d", {"insecure_open_store": "1"},
     StoreSpec("c10d", Endpoint("n", 29400), hosting=Hosting.BY_ADDRESS, insecure_open_store=True)),
    ("tcp", {"token": "t"}, StoreSpec("tcp", Endpoint("n", 29400), Secret("token", "t"))),
    ("tcp", {"token_file": "/t"}, StoreSpec("tcp", Endpoint("n", 29400), SecretFile("token_file", "/t"))),
    ("tcp", {"read_timeout": "3", "dial_timeout": "1"}, StoreSpec("tcp", Endpoint("n", 29400), timeouts=Timeouts(1, 3))),
    ("tcp", {"max_response_bytes": "lots", "protocol": "ftp"}, StoreSpec("tcp", Endpoint("n", 29400))),  # etcd's keys
])
def test_store_options_become_typed_fields(name, conf, expected):
    assert spec_from_conf(name, "n", conf) == expected


@pytest.mark.parametrize("text, says", [
    ("a:1,b:2", "The tcp backend takes one HOST[:PORT] (got 'a:1,b:2')."),
    ("a:0", "has port '0'"),
    ("https://a:1", "endpoint 'https://a:1' asks for TLS, which the built-in store lacks"),
])
def test_a_store_endpoint_is_one_host_and_port(text, says):
    assert store_endpoint("tcp", "http://a:1") == store_endpoint("tcp", "a:1") == Endpoint("a", 1)
    with pytest.raises(RendezvousConfigError) as raised:
        store_endpoint("tcp", text)
    assert says in str(raised.value)


def test_standalone_keeps_the_store_timeouts_and_becomes_a_tcp_store_with_a_fresh_token_once_hosted():
    spec = standalone_spec({"request_timeout": "3", "token": "ignored", "is_host": "1"})
    assert spec == StandaloneSpec(Timeouts(5, 3))
    hosted = spec.hosted_at(Endpoint("127.0.0.1", 4242), "fresh")
    assert hosted == StoreSpec("tcp", Endpoint("127.0.0.1", 4242), Secret("token", "fresh"), Hosting.CONNECT,
                               False, Timeouts(5, 3))


def test_the_specs_defaults_are_the_backends_own():
    from backends.etcd.channel_options import DEFAULT_MAX_RESPONSE_BYTES as etcd_default
    from backends.etcd.config import EtcdConfig
    from backends.tcp.client import TcpStoreConfig

    etcd = EtcdConfig(endpoints="e:1")
    assert (etcd.dial_timeout, etcd.request_timeout, etcd.max_response_bytes) == (
        ETCD_TIMEOUTS.dial, ETCD_TIMEOUTS.request, DEFAULT_MAX_RESPONSE_BYTES)
    assert DEFAULT_MAX_RESPONSE_BYTES == etcd_default
    store = TcpStoreConfig("e:1")
    assert (store.connect_timeout, store.request_timeout) == (STORE_TIMEOUTS.dial, STORE_TIMEOUTS.request)


def test_an_unknown_or_static_backend_has_no_store_spec():
    for name in ("static", "zookeeper"):
        with pytest.raises(RendezvousConfigError, match="choose one of etcd, etcd-v3, tcp, c10d"):
            spec_from_conf(name, "n", {})


# -- handlers from specs ---------------------------------------------------------------------------


def test_a_static_spec_gives_a_static_handler_at_its_master():
    handler = create_handler(StaticSpec(1, Endpoint("node0", 1234)), RendezvousSettings("job", 2, 2), "10.0.0.2")
    info = handler.next_rendezvous()
    assert (info.run_id, info.group_rank, info.group_world_size, info.master_addr, info.master_port) == (
        "job", 1, 2, "node0", 1234)


def test_a_standalone_spec_must_be_hosted_before_a_handler_uses_it():
    with pytest.raises(RendezvousConfigError, match="hosted"):
        create_handler(StandaloneSpec(), RendezvousSettings("job", 1, 1), "localhost")
