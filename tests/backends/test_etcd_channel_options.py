"""The grpcio channel options of the etcd client: every bound is explicit (pure, no sockets)."""

from __future__ import annotations

import pytest

from backends.etcd.channel_options import (
    DEFAULT_MAX_RESPONSE_BYTES,
    ChannelLimits,
    channel_options,
    request_limit,
)
from backends.etcd.config import MAX_VALUE_BYTES

MIB = 1024 * 1024


@pytest.mark.parametrize(
    "name, expected",
    [
        ("grpc.max_receive_message_length", 32 * MIB),
        ("grpc.max_send_message_length", MIB + 512 * 1024),
        ("grpc.max_metadata_size", 16 * 1024),
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 5_000),  # gRPC core's minimum connect timeout
        ("grpc.max_reconnect_backoff_ms", 1_000),
    ],
)
def test_the_default_client_sets_each_option_explicitly(name, expected):
    options = dict(channel_options(ChannelLimits(request_limit(MAX_VALUE_BYTES))))
    assert options[name] == expected


def test_a_connection_attempt_gets_the_dial_timeout_so_a_slow_links_greeting_fits():
    # Issue 27 item 3: a 100 ms minimum left each attempt ~1 s; a 1 s link needs 2 s for HTTP/2's greeting.
    options = dict(channel_options(ChannelLimits(request_limit(MAX_VALUE_BYTES), connect_timeout=12.5)))
    assert options["grpc.min_reconnect_backoff_ms"] == 12_500
    assert options["grpc.initial_reconnect_backoff_ms"] == 100  # a refused connect is still retried at once


def test_every_option_is_set_once_and_no_size_is_unbounded():
    options = channel_options(ChannelLimits(request_limit(MAX_VALUE_BYTES)))
    names = [name for name, _ in options]
    assert len(names) == len(set(names))
    sizes = {name: value for name, value in options if "length" in name or "size" in name}
    assert sizes and all(0 < value <= DEFAULT_MAX_RESPONSE_BYTES for value in sizes.values())


@pytest.mark.parametrize(
    "max_value_bytes, send_limit",
    [(MAX_VALUE_BYTES, 1536 * 1024), (10, 10 + 512 * 1024), (8 * MIB, 8 * MIB + 512 * 1024)],
)
def test_the_send_limit_is_the_value_limit_plus_etcds_grpc_overhead(max_value_bytes, send_limit):
    # With the default 1 MiB values that is 1.5 MiB, etcd's default --max-request-bytes.
    assert request_limit(max_value_bytes) == send_limit
