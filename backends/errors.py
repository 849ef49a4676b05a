"""The one error tree every backend raises.

Backends translate their foreign exceptions (gRPC, socket, asyncio) into these at the
boundary with ``raise ... from``, so the rendezvous engine handles one vocabulary whatever
the backend. Every message says what went wrong and what to do about it.
"""

from __future__ import annotations


class BackendError(Exception):
    """Base of every error a backend raises."""


class BackendConnectionError(BackendError):
    """The server could not be reached, or the connection to it was lost.

    Retrying later may succeed; the retry policy decides how long to try.
    """


class StoreFullError(BackendConnectionError):
    """The store refused a write because its database is full (etcd's NOSPACE alarm).

    Nothing was written. Reads, deletes and lease renewals still work; writes fail until an
    operator frees space, so callers treat it as an outage for writes (a connection error:
    retried like one) and the message names the commands that end it.
    """


class BackendTimeoutError(BackendError):
    """A request did not complete within its deadline; whether it applied is unknown."""


class BackendAuthError(BackendError):
    """The server rejected our credentials (wrong token, user or password, or certificate)."""


class BackendPermissionError(BackendAuthError):
    """The server knows the user, but the user's role may not access that key (etcd's
    "permission denied" with a valid token): an operator must grant it; retrying cannot help."""


class BackendClosedError(BackendError):
    """The client, or the watch, was closed by its owner; further calls are refused."""


class ProtocolError(BackendError):
    """The peer does not speak our protocol (a different service on that port, or a version skew)."""


class ValueTooLargeError(BackendError, ValueError):
    """A value exceeds the backend's size limit; nothing was written."""


class LimitExceededError(BackendError):
    """A request would pass one of the server's bounds (e.g. watches per connection); nothing was done."""


class LeaseNotFoundError(BackendError):
    """The lease does not exist: it expired or was revoked."""


class CompactedError(BackendError):
    """The history a watch asked for is gone.

    Attributes:
        requested_revision: the revision the watch asked to start from.
        compact_revision: the oldest revision the server still has history for, when known.
    """

    def __init__(self, message: str, *, requested_revision: int, compact_revision: int) -> None:
        super().__init__(message)
        self.requested_revision = requested_revision
        self.compact_revision = compact_revision


class EndpointError(BackendError, ValueError):
    """An endpoint or backend setting is malformed; the message names it and the accepted form."""
