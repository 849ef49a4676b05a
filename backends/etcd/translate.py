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
)
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


class DialFailure(enum.Enum):
    """Why a connection to one endpoint could not be set up."""

    UNREACHABLE = "unreachable"
    """Nothing answered (refused, timed out, unresolvable): may be transient."""
    PROTOCOL = "protocol"
    """Something answered but does not speak gRPC over HTTP/2: a wrong port or a TLS mismatch."""
    TLS = "tls"
    """The TLS handshake failed: certificates do not match."""


class RequestNotSent(BackendConnectionError):
    """No connection could be set up, so the request was never sent; even writes may be resent.

    Attributes:
        kind: why the connection failed (decides whether retrying can help).
    """

    def __init__(self, message: str, kind: DialFailure = DialFailure.UNREACHABLE) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Diagnosis:
    """A dial failure's kind and advice for the operator."""

    kind: DialFailure
    advice: str


def diagnose_dial_failure(details: str, tls: bool) -> Diagnosis:
    """Classify gRPC's "failed to connect" details for one endpoint."""
    text = details.lower()
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
        return Diagnosis(
            DialFailure.TLS,
            "the TLS handshake failed; check that ca_cert signed the server's certificate, that the host name "
            "matches it, and that the client certificate and key are accepted by the server",
        )
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
            DialFailure.UNREACHABLE,
            "the server closed the connection during the TLS handshake; it may be a plain-text server (then "
            "use http:// and no certificates), or it is restarting",
        )
    if "socket closed" in text or "connection reset" in text:
        hint = "" if tls else "; if etcd serves TLS, use https:// endpoints and ca_cert"
        return Diagnosis(DialFailure.UNREACHABLE, f"the server closed the connection during setup{hint}")
    if "resolution" in text or "resolve" in text:
        return Diagnosis(DialFailure.UNREACHABLE, "the host name does not resolve; fix the endpoint")
    return Diagnosis(DialFailure.UNREACHABLE, "check that etcd is running there and reachable")


def translate_rpc_error(
    error: grpc.RpcError,
    *,
    operation: str,
    endpoint: str,
    tls: bool = False,
    timeout: float | None = None,
    closed: bool = False,
    requested_revision: int = 0,
) -> BackendError:
    """Map one failed RPC to the backend error tree.

    Args:
        operation: what we were doing, e.g. ``"put /a/b"``, for the message.
        endpoint: the ``host:port`` the RPC went to.
        tls: whether TLS was configured (tunes the advice for dial failures).
        timeout: the deadline the RPC had, for the message.
        closed: the client was closed meanwhile (a CANCELLED RPC then means "closed").
        requested_revision: for compaction errors, the revision that was asked for.
    """
    code = error.code() if callable(getattr(error, "code", None)) else grpc.StatusCode.UNKNOWN
    details = (error.details() if callable(getattr(error, "details", None)) else None) or str(code)
    where = f"etcd {operation} on {endpoint}"
    text = details.lower()
    if code == grpc.StatusCode.UNAVAILABLE and text.startswith(NOT_CONNECTED_PREFIX):
        diagnosis = diagnose_dial_failure(details, tls)
        return RequestNotSent(
            f"Could not connect to etcd at {endpoint}: {diagnosis.advice} ({details}).", diagnosis.kind
        )
    if code == grpc.StatusCode.UNAVAILABLE:
        return BackendConnectionError(
            f"{where} lost its connection ({details}); if it was a write, whether it applied is unknown. "
            "Check etcd's health; the client resends only requests that are safe to resend."
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        budget = f" within {timeout:.3g}s" if timeout is not None else ""
        return BackendTimeoutError(
            f"{where} did not complete{budget}; whether it applied is unknown. "
            "Check etcd's health and load, or raise request_timeout."
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


def _is_response_too_large(text: str) -> bool:
    """Whether a RESOURCE_EXHAUSTED text is grpcio refusing a response (not the server a request)."""
    return _RESPONSE_TOO_LARGE_TEXT in text and not text.startswith("grpc:")


def _translate_server_error(code: grpc.StatusCode, details: str, where: str, requested_revision: int) -> BackendError:
    text = details.lower()
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED) or any(
        marker in text for marker in _AUTH_TEXTS
    ):
        return BackendAuthError(f"{where} was refused: {details}. Check the etcd user, password and role permissions.")
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


def translate_watch_cancel(reason: str, *, prefix: str, endpoint: str) -> BackendError:
    """Map the ``cancel_reason`` of a watch the server cancelled (other than for compaction)."""
    where = f"etcd watch on {prefix!r} at {endpoint}"
    if any(marker in reason.lower() for marker in _AUTH_TEXTS):
        return BackendAuthError(f"{where} was refused: {reason}. Check the etcd user's read permission on the prefix.")
    return BackendConnectionError(f"{where} was cancelled by the server: {reason or 'no reason given'}.")
