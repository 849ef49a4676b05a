"""Translate gRPC / etcd errors into :mod:`backends.errors`, with messages that say what to do.

Everything here is pure: it looks at a status code and its details text, never at the network,
so each rule is unit-tested with fabricated errors.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import grpc

from backends.errors import (
    BackendAuthError,
    BackendClosedError,
    BackendConnectionError,
    BackendError,
    BackendPermissionError,
    BackendTimeoutError,
    CompactedError,
    LeaseNotFoundError,
    ProtocolError,
    StoreFullError,
    ValueTooLargeError,
)

# etcd error texts (server/etcdserver/api/v3rpc/rpctypes/error.go) that decide the mapping.
_AUTH_TEXTS = (
    "invalid auth token",
    "authentication failed",
    "user name is empty",
    "user name not found",
    "permission denied",
    "invalid auth management",
    "root user does not",
    "revision of auth store is old",
    "revision in header is old",
)
_STALE_TOKEN_TEXTS = ("invalid auth token", "revision of auth store is old", "revision in header is old")
"""etcd's ErrInvalidAuthToken (a simple token unused for --auth-token-ttl, or one its member
forgot by restarting) and ErrAuthOldRevision (a JWT token issued before a user or role changed;
etcd 3.5.1 sends it untranslated, as "auth: revision in header is old"): the token is stale, not
the credentials; etcd's Go client authenticates again and resends, and so do we
(:mod:`backends.etcd.connection`, :mod:`backends.etcd.watch`)."""
_PERMISSION_TEXT = "permission denied"
_TOO_LARGE_TEXTS = ("request is too large", "larger than max", "message larger")
_COMPACTED_TEXT = "required revision has been compacted"
_NOSPACE_TEXT = "database space exceeded"
"""etcd's ErrGRPCNoSpace (RESOURCE_EXHAUSTED): its NOSPACE alarm is raised, every write that
costs space is refused until an operator frees space and disarms the alarm."""
_LEASE_NOT_FOUND_TEXT = "requested lease not found"
_RESPONSE_TOO_LARGE_TEXT = "received message larger than max"
"""grpcio's wording when a response passes our max_receive_message_length ("<where>: Received
message larger than max (N vs. M)"); a Go server refusing a request says "grpc: received ..."."""
_METADATA_TOO_LARGE_TEXT = "metadata size exceeds"
"""grpcio's wording when a header block passes our max_metadata_size."""
NOT_CONNECTED_PREFIX = "failed to connect to all addresses"
"""gRPC's wording when no connection existed: the request was never sent."""
_STREAM_REMOVED_TEXT = "stream removed"
"""gRPC core's wording (with INTERNAL or UNKNOWN) for a call its transport ended without a gRPC
status: the server reset the stream or ended it without trailers ("Data frame with END_STREAM
flag received"). etcd serving TLS does that to every open call when it stops gracefully: under
TLS its gRPC runs inside Go's HTTP/2 server, which closes open streams so. The connection is
lost, as with UNAVAILABLE (etcd's Go client, too, resumes after INTERNAL: ``isHaltErr``)."""
_UNRESOLVED_TEXTS = ("errors resolving", "dns resolution failed", "domain name not found", "name or service not known",
                     "no address associated", "temporary failure in name resolution")
"""gRPC's wordings (c-ares and the native resolver) for a host name that does not resolve."""


class DialFailure(enum.Enum):
    """Why a connection to one endpoint could not be set up."""

    UNREACHABLE = "unreachable"
    """Nothing answered (refused, timed out): may be transient."""
    UNRESOLVED = "unresolved"
    """The host name does not resolve: a typo, or a name DNS does not know (yet)."""
    CLOSED = "closed"
    """Something accepted the connection and closed it during setup: TLS on one side only, a
    server that is not etcd, or etcd restarting (:mod:`backends.etcd.diagnose` tells which)."""
    PROTOCOL = "protocol"
    """Something answered but does not speak gRPC over HTTP/2: a wrong port or a TLS mismatch."""
    TLS = "tls"
    """The TLS handshake failed: certificates do not match."""


class RequestNotSent(BackendConnectionError):
    """No connection could be set up, so the request was never sent; even writes may be resent.

    Attributes:
        kind: why the connection failed (decides whether retrying can help).
        endpoint, advice, details: where, what to do, and gRPC's own words (empty when the
            message was built otherwise), so failures of several endpoints read as one line.
    """

    def __init__(self, message: str, kind: DialFailure = DialFailure.UNREACHABLE, *, endpoint: str = "",
                 advice: str = "", details: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.endpoint = endpoint
        self.advice = advice
        self.details = details


def not_sent(endpoints: list[str], diagnosis: Diagnosis, details: str) -> RequestNotSent:
    """The one line for endpoints that all failed to connect for the same reason."""
    where = ", ".join(endpoints)
    return RequestNotSent(f"Could not connect to etcd at {where}: {diagnosis.advice} ({details}).", diagnosis.kind,
                          endpoint=where, advice=diagnosis.advice, details=details)


def merge_not_sent(failures: list[BackendError]) -> RequestNotSent | None:
    """One error for endpoints that all failed to connect for the same reason (None: they did not)."""
    if len(failures) == 1 and isinstance(failures[0], RequestNotSent):
        return failures[0]
    if not all(isinstance(error, RequestNotSent) and error.advice for error in failures):
        return None
    reasons = {(error.kind, error.advice) for error in failures}  # type: ignore[union-attr]
    if len(reasons) != 1:
        return None
    [(kind, advice)] = reasons
    return not_sent([error.endpoint for error in failures], Diagnosis(kind, advice),  # type: ignore[union-attr]
                    failures[0].details)  # type: ignore[union-attr]

def short_details(details: str) -> str:
    """gRPC's text without its framing: ``failed to connect to all addresses; last error: UNKNOWN:
    ipv4:10.0.0.1:2379: Failed to connect to remote host: Connection refused`` -> ``Failed to
    connect to remote host: Connection refused``."""
    text = details.split("last error: ", 1)[-1]
    for framing in ("UNKNOWN: ", "UNAVAILABLE: "):
        text = text.removeprefix(framing)
    head, separator, rest = text.partition(": ")
    if separator and head.count(":") >= 2 and head.split(":", 1)[0] in ("ipv4", "ipv6", "unix", "dns"):
        text = rest  # the address, which the message names already
    return text.strip() or details


@dataclass(frozen=True)
class Diagnosis:
    """A dial failure's kind and advice for the operator."""

    kind: DialFailure
    advice: str


def diagnose_dial_failure(details: str, tls: bool) -> Diagnosis:
    """Classify gRPC's "failed to connect" details for one endpoint."""
    text = details.lower()
    if any(marker in text for marker in _UNRESOLVED_TEXTS):
        return Diagnosis(
            DialFailure.UNRESOLVED,
            "the host name does not resolve; fix --rdzv-endpoint, or add the name to DNS or /etc/hosts",
        )
    if "connection refused" in text:
        return Diagnosis(
            DialFailure.UNREACHABLE, "nothing listens there (connection refused); start etcd or fix the endpoint"
        )
    if "no such file or directory" in text:
        return Diagnosis(
            DialFailure.UNREACHABLE,
            "no unix socket exists at that path; start etcd with --listen-client-urls unix://... there or fix the path",
        )
    if any(marker in text for marker in ("certificate", "tls handshake", "ssl handshake", "tsi_", "ssl_error")):
        return Diagnosis(DialFailure.TLS, _tls_advice(text))
    if "http/2" in text:
        hint = "a plain-text server while TLS is configured" if tls else "a TLS server (then use https:// and ca_cert)"
        return Diagnosis(
            DialFailure.PROTOCOL,
            f"it answered, but not in gRPC's HTTP/2; it is not an etcd client URL (etcd serves clients on port "
            f"2379 by default) or it is {hint}",
        )
    if "settings frame" in text:
        return Diagnosis(
            DialFailure.UNREACHABLE,
            "it accepted the connection but sent no HTTP/2 greeting within the connect timeout; etcd may still be "
            "starting, or answer more slowly than dial_timeout allows (a slow link: raise --rdzv-conf dial_timeout), "
            "or this is not an etcd client URL, or TLS settings do not match the server's (https:// and ca_cert)",
        )
    if "handshake read failed" in text:
        return Diagnosis(
            DialFailure.CLOSED,
            "the server closed the connection during the TLS handshake; it may be a plain-text server (then "
            "use http:// and no certificates), or it is restarting",
        )
    if "socket closed" in text or "connection reset" in text:
        hint = "" if tls else "; if etcd serves TLS, use https:// endpoints and ca_cert"
        return Diagnosis(DialFailure.CLOSED, f"the server closed the connection during setup{hint}")
    return Diagnosis(DialFailure.UNREACHABLE, "check that etcd is running there and reachable")


def _auth_advice(text: str) -> str:
    """What to do about a request etcd refused for auth, from its ``text`` (lower case)."""
    if "user name is empty" in text:
        return "etcd has auth enabled: pass --rdzv-conf user=NAME,password_file=FILE."
    if "authentication failed" in text or "user name not found" in text:
        return "Check --rdzv-conf user= and the password (password_file=)."
    if any(marker in text for marker in _STALE_TOKEN_TEXTS):
        return ("The auth token is stale (unused for etcd's --auth-token-ttl, its member restarted, or users or "
                "roles changed since it was issued); the client authenticates again and resends.")
    if _PERMISSION_TEXT in text:
        return ("The etcd user's role lacks access to those keys: grant it readwrite on the namespace prefix "
                "(etcdctl role grant-permission --prefix=true ROLE readwrite /elastic/, or the namespace= given).")
    return "Check --rdzv-conf user=, the password (password_file=) and the user's role permissions."


def _tls_advice(text: str) -> str:
    """What to do about a failed TLS handshake, from OpenSSL's reason in gRPC's ``text`` (lower case)."""
    if any(marker in text for marker in ("verify_failed", "local issuer", "bad_signature", "signature failure",
                                         "self signed", "self-signed", "unknown ca")):
        return ("the TLS handshake failed: the server's certificate is not signed by the CA this client trusts; "
                "pass the CA that signed it as --rdzv-conf cacert=CA_FILE")
    if any(marker in text for marker in ("hostname", "host name", "peer name", "subject alt")):
        return ("the TLS handshake failed: the server's certificate does not name this host; use the name or "
                "address the certificate was issued for in --rdzv-endpoint")
    if any(marker in text for marker in ("alert_bad_certificate", "certificate_required", "alert_certificate",
                                         "alert_unknown_ca", "alert_handshake_failure")):
        return ("the TLS handshake failed: the server refused this client's certificate (or its absence); etcd runs "
                "with --client-cert-auth: pass --rdzv-conf cert=CERT_FILE,key=KEY_FILE signed by etcd's "
                "--trusted-ca-file")
    return ("the TLS handshake failed; check that cacert= signed the server's certificate, that the host name "
            "matches it, and that the client certificate and key (cert=, key=) are accepted by the server")


def translate_rpc_error(
    error: grpc.RpcError,
    *,
    operation: str,
    endpoint: str,
    tls: bool = False,
    timeout: float | None = None,
    closed: bool = False,
    requested_revision: int = 0,
    writes: bool = True,
    stream: bool = False,
) -> BackendError:
    """Map one failed RPC to the backend error tree.

    Args:
        operation: what we were doing, e.g. ``"put /a/b"``, for the message.
        endpoint: the ``host:port`` the RPC went to.
        tls: whether TLS was configured (tunes the advice for dial failures).
        timeout: the deadline the RPC had, for the message.
        closed: the client was closed meanwhile (a CANCELLED RPC then means "closed").
        requested_revision: for compaction errors, the revision that was asked for.
        writes: the request may have changed something (a read's lost answer changes nothing,
            so its message does not say "whether it applied is unknown").
        stream: the RPC is the watch stream, a read the client resumes by itself: a lost
            connection's message says so, not that it applied or is resent.
    """
    code = error.code() if callable(getattr(error, "code", None)) else grpc.StatusCode.UNKNOWN
    details = (error.details() if callable(getattr(error, "details", None)) else None) or str(code)
    where = f"etcd {operation} on {endpoint}"
    text = details.lower()
    if code == grpc.StatusCode.UNAVAILABLE and (
        text.startswith(NOT_CONNECTED_PREFIX) or any(marker in text for marker in _UNRESOLVED_TEXTS)
    ):
        return not_sent([endpoint], diagnose_dial_failure(details, tls), short_details(details))
    stream_lost = code == grpc.StatusCode.UNAVAILABLE or _is_stream_removed(code, text)
    if stream_lost and stream:
        return BackendConnectionError(
            f"{where} lost its connection ({details}); watches resume once etcd answers, each from the revision "
            "after the last event it delivered: no change is missed or repeated"
        )
    if stream_lost:
        unknown = "; whether it applied is unknown" if writes else ""
        return BackendConnectionError(
            f"{where} lost its connection ({details}){unknown}. "
            "Check etcd's health; the client resends only requests that are safe to resend."
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        budget = f" within {timeout:.3g}s" if timeout is not None else ""
        unknown = "; whether it applied is unknown" if writes else ""
        return BackendTimeoutError(
            f"{where} did not complete{budget}{unknown}. Check etcd's health and load, or raise request_timeout."
        )
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and _is_response_too_large(text):
        return ProtocolError(
            f"{where} got a response larger than this client accepts ({details}); if that much data is "
            "expected, raise max_response_bytes (--rdzv-conf max_response_bytes=BYTES), otherwise check that "
            "the endpoint is etcd."
        )
    if _NOSPACE_TEXT in text:
        return StoreFullError(f"{where} was refused: etcd is out of space ({details}). {nospace_fix(endpoint)}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and _METADATA_TOO_LARGE_TEXT in text:
        return ProtocolError(
            f"{where} got response headers larger than this client accepts ({details}); etcd sends a few "
            "hundred bytes of headers, so check that the endpoint is etcd and not a proxy or another service."
        )
    if code == grpc.StatusCode.CANCELLED:
        if closed:
            return BackendClosedError(f"{where} was interrupted because the client was closed.")
        return BackendConnectionError(f"{where} was cancelled ({details}); retry it.")
    return _translate_server_error(code, details, where, requested_revision)


def nospace_fix(endpoint: str) -> str:
    """What an operator runs to end etcd's NOSPACE alarm (etcd's maintenance guide, "space quota")."""
    at = f"etcdctl --endpoints={endpoint}"
    return (f"Free space and disarm the alarm: delete what filled it, then `{at} compact REV` (REV: the "
            f"\"revision\" in `{at} endpoint status -w json`), `{at} defrag`, `{at} alarm disarm`; or raise "
            f"etcd's --quota-backend-bytes.")


def _is_stream_removed(code: grpc.StatusCode, text: str) -> bool:
    """Whether the transport ended the call without a status (see :data:`_STREAM_REMOVED_TEXT`)."""
    return code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN) and text.startswith(_STREAM_REMOVED_TEXT)


def _is_response_too_large(text: str) -> bool:
    """Whether a RESOURCE_EXHAUSTED text is grpcio refusing a response (not the server a request)."""
    return _RESPONSE_TOO_LARGE_TEXT in text and not text.startswith("grpc:")


def _translate_server_error(code: grpc.StatusCode, details: str, where: str, requested_revision: int) -> BackendError:
    text = details.lower()
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED) or any(
        marker in text for marker in _AUTH_TEXTS
    ):
        refused = BackendPermissionError if _is_permission_refusal(text) else BackendAuthError
        return refused(f"{where} was refused: {details}. {_auth_advice(text)}")
    if _LEASE_NOT_FOUND_TEXT in text:
        return LeaseNotFoundError(f"{where} failed: the lease expired or was revoked ({details}).")
    if any(marker in text for marker in _TOO_LARGE_TEXTS):
        return ValueTooLargeError(
            f"{where} was refused as too large ({details}); keep values small or raise etcd's --max-request-bytes."
        )
    if _COMPACTED_TEXT in text:
        return CompactedError(
            f"{where} asked for revision {requested_revision}, whose history etcd has compacted ({details}); "
            "re-read the current state and continue from there.",
            requested_revision=requested_revision,
            compact_revision=0,
        )
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return ProtocolError(
            f"{where} failed: the server does not implement the etcd v3 API ({details}); "
            "is the endpoint an etcd >= 3.4 client URL?"
        )
    return BackendError(f"{where} failed with {code.name}: {details}.")


def _is_permission_refusal(text: str) -> bool:
    """Whether etcd's ``text`` (lower case) says the role lacks the key, not that the token is stale."""
    return _PERMISSION_TEXT in text and not any(marker in text for marker in _STALE_TOKEN_TEXTS)


def translate_watch_cancel(reason: str, *, prefix: str, endpoint: str) -> BackendError:
    """Map the ``cancel_reason`` of a watch the server cancelled (other than for compaction).

    etcd 3.5 cancels a create sent with a stale token as "permission denied" too, so the watch
    hub retries such a create once with a fresh token before this error stands.
    """
    where = f"etcd watch on {prefix!r} at {endpoint}"
    text = reason.lower()
    if any(marker in text for marker in _AUTH_TEXTS):
        refused = BackendPermissionError if _is_permission_refusal(text) else BackendAuthError
        return refused(f"{where} was refused: {reason}. {_auth_advice(text)}")
    return BackendConnectionError(f"{where} was cancelled by the server: {reason or 'no reason given'}.")
