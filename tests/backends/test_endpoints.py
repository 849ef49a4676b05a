"""Endpoint parsing: every accepted form, and a sentence for every rejected one."""

import pytest

from backends.endpoints import Endpoint, parse_endpoint, parse_endpoints
from backends.errors import EndpointError


@pytest.mark.parametrize(
    "text, expected",
    [
        ("127.0.0.1:2379", Endpoint("127.0.0.1", 2379)),
        ("localhost", Endpoint("localhost", 2379)),
        ("http://etcd-0.etcd:2380/", Endpoint("etcd-0.etcd", 2380)),
        ("https://etcd:443", Endpoint("etcd", 443, "https")),
        ("[::1]:2379", Endpoint("::1", 2379)),
        ("[::1]", Endpoint("::1", 2379)),
        ("  node-3:29400 ", Endpoint("node-3", 29400)),
    ],
)
def test_valid_endpoints_parse(text, expected):
    assert parse_endpoint(text, 2379) == expected


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "no host"),
        ("host:0", "port"),
        ("host:65536", "port"),
        ("host:abc", "port"),
        ("ftp://host:1", "scheme"),
        ("::1:2379", "IPv6"),
        ("[::1:2379", "bracket"),
        ("us er@host:1", "user info"),
        ("us er:1", "invalid host"),
    ],
)
def test_malformed_endpoints_raise_a_sentence_naming_the_problem(text, says):
    with pytest.raises(EndpointError, match=says):
        parse_endpoint(text, 2379)


def test_a_list_keeps_order_and_skips_blank_entries():
    assert parse_endpoints("a:1, b:2,", 2379) == (Endpoint("a", 1), Endpoint("b", 2))
    assert parse_endpoints(["a", "b:3"], 9) == (Endpoint("a", 9), Endpoint("b", 3))


def test_an_empty_list_is_rejected():
    with pytest.raises(EndpointError, match="No endpoint"):
        parse_endpoints(" , ", 2379)


def test_netloc_brackets_ipv6_hosts():
    assert Endpoint("::1", 1).netloc == "[::1]:1"
    assert str(Endpoint("h", 2)) == "h:2"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("unix:///run/etcd/etcd.sock", Endpoint("/run/etcd/etcd.sock", 0, "unix")),
        ("unix:/run/etcd.sock", Endpoint("/run/etcd.sock", 0, "unix")),
        (" UNIX:///tmp/w/localhost:2379 ", Endpoint("/tmp/w/localhost:2379", 0, "unix")),
    ],
)
def test_unix_socket_endpoints_parse_where_allowed_and_name_grpcs_target(text, expected):
    endpoint = parse_endpoint(text, 2379, allow_unix=True)
    assert endpoint == expected
    assert endpoint.netloc == f"unix:{expected.host}" == str(endpoint)


@pytest.mark.parametrize(
    "text, allow_unix, says",
    [
        ("unix:///run/etcd.sock", False, "only etcd endpoints"),
        ("unix:relative.sock", True, "absolute socket path"),
        ("unix://", True, "absolute socket path"),
        ("unix:///", True, "absolute socket path"),
        ("unix:///run/a?b", True, "absolute socket path"),
    ],
)
def test_unix_socket_endpoints_that_cannot_work_raise_a_sentence(text, allow_unix, says):
    with pytest.raises(EndpointError, match=says):
        parse_endpoint(text, 2379, allow_unix=allow_unix)
