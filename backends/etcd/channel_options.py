"""The grpcio channel options of every etcd connection, in one place, each with its reason.

grpcio's defaults suit a general RPC client, not a long-lived etcd client: a 4 MiB response
limit (too small for a prefix read of many join records, too large to be a deliberate bound),
no send limit, reconnect backoff growing to 120 s, and no keepalive pings. Everything that
bounds what a server can make us hold, or how fast we notice a dead member, is set here
explicitly rather than left to a library default.
"""

from __future__ import annotations

from dataclasses import dataclass

ETCD_GRPC_OVERHEAD_BYTES = 512 * 1024
"""What etcd adds to ``--max-request-bytes`` for its gRPC receive limit (``grpcOverheadBytes``)."""

DEFAULT_MAX_RESPONSE_BYTES = 32 * 1024 * 1024
"""Largest response a client accepts by default: a prefix read of ~100k join records (a join
record with its key and revisions is ~250 bytes) or 32 values at the 1 MiB value limit. etcd
itself sends responses of any size (its send limit is 2^31-1), so this is the client's bound on
the memory one hostile or runaway response can take."""

MAX_METADATA_BYTES = 16 * 1024
"""Largest header block accepted: etcd sends a few hundred bytes (content type, gRPC status and
an error text); this bounds a hostile server's headers and CONTINUATION frames."""

KEEPALIVE_TIME_MS = 10_000
"""Ping after 10 s without traffic: notice a silently dead member under a long-lived watch.
etcd answers pings sent more often than every 5 s (``--grpc-keepalive-min-time``) with GOAWAY."""

KEEPALIVE_TIMEOUT_MS = 5_000
"""Drop the connection when a ping is not answered within 5 s (then fail over)."""

RECONNECT_BACKOFF_MS = (100, 1_000)
"""Initial and maximum reconnect backoff: find a restarted member within a second (grpcio's
default grows to 120 s)."""

DEFAULT_CONNECT_TIMEOUT_S = 5.0
"""The least time one connection attempt (TCP, TLS, HTTP/2's greeting) gets, by default the
etcd client's ``dial_timeout``. gRPC core reads it from ``grpc.min_reconnect_backoff_ms``: it
gives an attempt ``max(that, the current backoff)``. It was the 100 ms minimum backoff, which
left an attempt about 1 s, so on a link with 1 s of latency (a greeting costs 2 round trips)
no connection ever came up and the error blamed a missing HTTP/2 greeting or TLS."""


@dataclass(frozen=True)
class ChannelLimits:
    """The per-client figures the options depend on.

    Attributes:
        max_request_bytes: largest message we send (etcd's own receive limit for its default
            ``--max-request-bytes``, 1.5 MiB, is 2 MiB; see :func:`request_limit`).
        max_response_bytes: largest message we accept.
        connect_timeout: seconds one connection attempt may take.
    """

    max_request_bytes: int
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S
    """Seconds one connection attempt may take (see :data:`DEFAULT_CONNECT_TIMEOUT_S`)."""


def request_limit(max_value_bytes: int) -> int:
    """The send limit for a client whose values are at most ``max_value_bytes``: the value plus
    etcd's own gRPC overhead allowance, so a too-large request fails locally, not on the wire."""
    return max_value_bytes + ETCD_GRPC_OVERHEAD_BYTES


def channel_options(limits: ChannelLimits) -> tuple[tuple[str, int], ...]:
    """grpcio channel arguments for one etcd endpoint (``grpc.insecure_channel(..., options=)``)."""
    initial, maximum = RECONNECT_BACKOFF_MS
    return (
        # Bound what one response can make us buffer; a larger one fails with RESOURCE_EXHAUSTED.
        ("grpc.max_receive_message_length", limits.max_response_bytes),
        # Refuse an oversized request before sending it (etcd would refuse it after receiving).
        ("grpc.max_send_message_length", limits.max_request_bytes),
        # Bound the header block a server may send (HTTP/2 SETTINGS_MAX_HEADER_LIST_SIZE).
        ("grpc.max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        # No pings without a call in flight: etcd's enforcement policy (PermitWithoutStream:
        # false) answers them with GOAWAY "too_many_pings"; an agent always has a watch open.
        ("grpc.keepalive_permit_without_calls", 0),
        # Keep pinging an idle watch stream for as long as it lives (grpcio stops after 2
        # pings without data, and etcd's progress notifications come only every 10 minutes).
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.initial_reconnect_backoff_ms", initial),
        # gRPC core's minimum connect timeout (see DEFAULT_CONNECT_TIMEOUT_S), not a backoff: a
        # refused connect still fails at once and is retried after the backoff above.
        ("grpc.min_reconnect_backoff_ms", max(round(limits.connect_timeout * 1000), initial)),
        ("grpc.max_reconnect_backoff_ms", maximum),
    )
