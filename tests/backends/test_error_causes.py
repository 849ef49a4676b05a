"""Errors say the cause: each way of failing to reach etcd or the built-in store is one line
naming the endpoint and the fix.

The classification is pure (gRPC's status and text in, an error and its words out): a case
table here. The real-etcd counterparts (a name that does not resolve, a refused port, TLS on
one side only, a CA that did not sign, a wrong password, no user, a port that is not etcd)
run the launcher against real servers in tests/backends/test_etcd_error_lines.py.
"""

from __future__ import annotations

import socket

import grpc
import pytest

from backends.endpoints import Endpoint
from backends.errors import BackendAuthError, BackendConnectionError, BackendPermissionError, BackendTimeoutError
from backends.etcd.config import EtcdConfig
from backends.etcd.diagnose import NOT_ETCD, SERVES_PLAIN, SERVES_TLS, second_look
from backends.tcp.advice import dial_advice
from backends.etcd.translate import (
    DialFailure, Diagnosis, RequestNotSent, merge_not_sent, not_sent, short_details, translate_rpc_error,
    translate_watch_cancel,
)

UNAVAILABLE, DEADLINE = grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED
ENDPOINT = "10.0.0.1:2379"


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def translate(code, details, *, tls=False, writes=True):
    return translate_rpc_error(FakeRpcError(code, details), operation="get '/'", endpoint=ENDPOINT, tls=tls,
                               timeout=5, writes=writes)


@pytest.mark.parametrize(("code", "details", "tls", "kind", "says"), [
    # a name that does not resolve (c-ares, and the native resolver)
    (UNAVAILABLE, "errors resolving etcd-0:2379: [field:hostname lookup error:address lookup failed for "
     "etcd-0:2379: Domain name not found]", False, DialFailure.UNRESOLVED, "host name does not resolve"),
    (UNAVAILABLE, "DNS resolution failed for etcd-0:2379: C-ares status is not ARES_SUCCESS qtype=A name=etcd-0 "
     "is_balancer=0: Domain name not found", False, DialFailure.UNRESOLVED, "fix --rdzv-endpoint"),
    (UNAVAILABLE, "failed to connect to all addresses; last error: UNAVAILABLE: Name or service not known", False,
     DialFailure.UNRESOLVED, "DNS or /etc/hosts"),
    # a refused connection
    (UNAVAILABLE, "failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.1:2379: Failed to connect "
     "to remote host: Connection refused", False, DialFailure.UNREACHABLE, "nothing listens there"),
    # TLS: the CA, the host name, the client certificate
    (UNAVAILABLE, "failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.1:2379: Tls handshake "
     "failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:"
     "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate", True, DialFailure.TLS, "cacert=CA_FILE"),
    (UNAVAILABLE, "failed to connect to all addresses; last error: UNKNOWN: Tls handshake failed: error:1a000064:"
     "ECDSA routines:OPENSSL_internal:BAD_SIGNATURE: certificate signature failure", True, DialFailure.TLS,
     "not signed by the CA"),
    (UNAVAILABLE, "failed to connect to all addresses; last error: UNKNOWN: Tls handshake failed: Peer name "
     "etcd-0 is not in peer certificate", True, DialFailure.TLS, "does not name this host"),
    (UNAVAILABLE, "failed to connect to all addresses; last error: UNKNOWN: Tls handshake failed "
     "(TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:10000412:SSL routines:OPENSSL_internal:"
     "SSLV3_ALERT_BAD_CERTIFICATE", True, DialFailure.TLS, "cert=CERT_FILE,key=KEY_FILE"),
    # TLS on one side only, or not etcd: gRPC sees a closed or garbled connection
    (UNAVAILABLE, "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:10.0.0.1:2379: Handshake "
     "read failed (Socket closed)", True, DialFailure.CLOSED, "plain-text server"),
    (UNAVAILABLE, "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:10.0.0.1:2379: Socket closed",
     False, DialFailure.CLOSED, "use https://"),
    (UNAVAILABLE, "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:10.0.0.1:2379: Failed "
     "parsing HTTP/2 (Expected SETTINGS frame as the first frame, got frame type 79)", False, DialFailure.PROTOCOL,
     "not an etcd client URL"),
])
def test_a_connection_that_never_formed_names_the_endpoint_its_cause_and_the_fix(code, details, tls, kind, says):
    error = translate(code, details, tls=tls)
    assert isinstance(error, RequestNotSent) and error.kind is kind
    text = str(error)
    assert text.startswith(f"Could not connect to etcd at {ENDPOINT}: ") and says in text, text
    assert "applied" not in text and "\n" not in text


@pytest.mark.parametrize(("code", "details", "writes", "error_type", "unknown"), [
    (UNAVAILABLE, "Socket closed", False, BackendConnectionError, False),  # a read lost its answer: nothing to guess
    (UNAVAILABLE, "Socket closed", True, BackendConnectionError, True),  # a write may have applied
    (DEADLINE, "Deadline Exceeded", False, BackendTimeoutError, False),
    (DEADLINE, "Deadline Exceeded", True, BackendTimeoutError, True),
])
def test_only_a_write_in_flight_says_whether_it_applied_is_unknown(code, details, writes, error_type, unknown):
    error = translate(code, details, writes=writes)
    assert type(error) is error_type and ENDPOINT in str(error)
    assert ("whether it applied is unknown" in str(error)) is unknown


@pytest.mark.parametrize(("details", "says"), [
    ("etcdserver: user name is empty", "pass --rdzv-conf user=NAME,password_file=FILE"),
    ("etcdserver: authentication failed, invalid user ID or password", "password_file="),
    ("etcdserver: permission denied", "grant-permission"),
])
def test_auth_refusals_say_which_setting_to_fix(details, says):
    error = translate(grpc.StatusCode.INVALID_ARGUMENT, details)
    assert isinstance(error, BackendAuthError) and ENDPOINT in str(error) and says in str(error)


PERMISSION, UNAUTHENTICATED, INVALID, UNKNOWN = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED,
                                                grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNKNOWN)
BLAME = ("password", "grant", "permission on", "role lacks", "user=")
"""Advice that sends the operator to the credentials or the grants."""


@pytest.mark.parametrize(("code", "details"), [
    (UNAUTHENTICATED, "etcdserver: invalid auth token"),  # a simple token unused for --auth-token-ttl, or a restart
    (INVALID, "etcdserver: revision of auth store is old"),  # a JWT token from before a user or role changed
    (UNKNOWN, "auth: revision in header is old"),  # the same, as etcd 3.5.1 sends it
])
def test_a_stale_token_is_an_auth_error_that_blames_neither_the_password_nor_the_grants(code, details):
    error = translate(code, details)
    assert type(error) is BackendAuthError and "stale" in str(error) and "authenticates again" in str(error)
    assert not [word for word in BLAME if word in str(error).lower()], str(error)


def test_a_permission_refusal_is_a_permission_error_naming_the_grant():
    error = translate(PERMISSION, "etcdserver: permission denied")
    assert isinstance(error, BackendPermissionError)
    assert "etcdctl role grant-permission --prefix=true ROLE readwrite /elastic/" in str(error)


@pytest.mark.parametrize(("reason", "kind", "says"), [
    # etcd 3.4 cancels a create sent with a lapsed token so; 3.5 says "permission denied" (the watch
    # hub retries a create once with a fresh token before either error stands)
    ("rpc error: code = Unauthenticated desc = etcdserver: invalid auth token", BackendAuthError, "stale"),
    ("rpc error: code = InvalidArgument desc = etcdserver: revision of auth store is old", BackendAuthError, "stale"),
    ("rpc error: code = PermissionDenied desc = etcdserver: permission denied", BackendPermissionError,
     "grant-permission --prefix=true ROLE readwrite"),
    ("etcdserver: mvcc: required revision is a future revision", BackendConnectionError, "cancelled by the server"),
])
def test_a_watch_cancelled_for_a_stale_token_is_not_reported_as_a_permission_problem(reason, kind, says):
    error = translate_watch_cancel(reason, prefix="/elastic/run/", endpoint=ENDPOINT)
    assert type(error) is kind and says in str(error) and "'/elastic/run/'" in str(error), str(error)
    if kind is BackendAuthError:
        assert not [word for word in BLAME if word in str(error).lower()], str(error)


@pytest.mark.parametrize(("details", "short"), [
    ("failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.1:2379: Failed to connect to remote "
     "host: Connection refused", "Failed to connect to remote host: Connection refused"),
    ("failed to connect to all addresses; last error: UNAVAILABLE: ipv6:[::1]:2379: Socket closed", "Socket closed"),
    ("errors resolving etcd-0:2379: Domain name not found", "errors resolving etcd-0:2379: Domain name not found"),
])
def test_grpc_framing_is_cut_from_the_details(details, short):
    assert short_details(details) == short


def test_endpoints_failing_alike_make_one_sentence_and_unlike_ones_do_not():
    unresolved = Diagnosis(DialFailure.UNRESOLVED, "the host name does not resolve; fix --rdzv-endpoint")
    refused = Diagnosis(DialFailure.UNREACHABLE, "nothing listens there (connection refused)")
    alike = merge_not_sent([not_sent(["etcd-0:2379"], unresolved, "Domain name not found"),
                     not_sent(["etcd-1:2379"], unresolved, "Domain name not found")])
    assert str(alike) == ("Could not connect to etcd at etcd-0:2379, etcd-1:2379: the host name does not resolve; "
                          "fix --rdzv-endpoint (Domain name not found).")
    assert alike.kind is DialFailure.UNRESOLVED
    assert merge_not_sent([not_sent(["a:1"], unresolved, "x"), not_sent(["b:1"], refused, "y")]) is None
    assert merge_not_sent([not_sent(["a:1"], unresolved, "x"), BackendConnectionError("lost")]) is None


def closed(endpoints: str = "a:2379") -> RequestNotSent:
    return not_sent(endpoints.split(","), Diagnosis(DialFailure.CLOSED, "the server closed the connection"), "x")


@pytest.mark.parametrize(("endpoints", "error", "answers", "expected"), [
    ("a:2379", closed(), {"a": True}, SERVES_TLS),  # plain http to a TLS port
    ("https://a:2379", closed(), {"a": False}, SERVES_PLAIN),  # https to a plain port
    ("a:2379", closed(), {"a": False}, NOT_ETCD),  # plain both ways, still closed: not etcd
    ("a:2379,b:2379", closed("a:2379,b:2379"), {"a": True, "b": None}, SERVES_TLS),  # b unreachable: a decides
    ("a:2379,b:2379", closed("a:2379,b:2379"), {"a": True, "b": False}, None),  # they disagree: no guess
    ("a:2379", closed(), {"a": None}, None),  # nothing answered (or a silent port): no conclusion
    ("a:2379", not_sent(["a:2379"], Diagnosis(DialFailure.UNREACHABLE, "connection refused"), "x"), {"a": True},
     None),  # refused or unresolved: the line is already right
])
def test_a_second_look_names_tls_on_one_side_only_or_a_port_that_is_not_etcd(endpoints, error, answers, expected):
    probed = []

    def probe(host: str, port: int) -> bool | None:
        probed.append(Endpoint(host, port).netloc)
        return answers[host]

    found = second_look(error, EtcdConfig(endpoints), probe)
    if expected is None:
        assert found is None
    else:
        assert found is not None and expected in str(found) and str(found).startswith("Could not connect to etcd at a:")


# -- the built-in store -----------------------------------------------------------------------
@pytest.mark.parametrize(("error", "says"), [
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
     "the host name does not resolve (Name or service not known); fix --rdzv-endpoint"),
    (ConnectionRefusedError(111, "Connection refused"), "nothing listens there (connection refused); start the store"),
    (TimeoutError("timed out"), "it did not answer within 5s; check that the host is up"),
    (OSError(113, "No route to host"), "No route to host"),
])
def test_a_store_connection_that_failed_says_why_and_what_to_do(error, says):
    assert says in dial_advice(error, 5.0)
