"""A slow link to etcd (issue 27 item 3): the node connects, measures the round trip and fits its
timeouts to it, saying so in one line; a real etcd behind :class:`~support.latency_proxy.LatencyProxy`."""

from __future__ import annotations

import logging

import pytest

from elastic.rendezvous.backend_spec import spec_from_conf
from elastic.rendezvous.latency import Timing, fit_to_round_trip, raised
from elastic.rendezvous.registry import create_handler
from elastic.rendezvous.settings import RendezvousSettings
from elastic.testing.etcd_server import ROOT_USER

from support.latency_proxy import LatencyProxy


@pytest.mark.parametrize("round_trip, given, expected", [
    (0.001, Timing(5, 5, 3), Timing(5, 5, 3)),  # loopback: nothing changes
    (0.4, Timing(5, 5, 3), Timing(5, 5, 3)),  # 200 ms each way still fits
    (2.0, Timing(5, 5, 3), Timing(6, 10, 8)),  # 1 s each way
    (2.0, Timing(5, 30, 10), Timing(6, 30, 10)),  # torchrun's read_timeout=30: only the dial is raised
    (0.9, Timing(1, 1, 2), Timing(3, 5, 4)),  # rounded up to whole seconds
])
def test_timeouts_are_raised_to_their_share_of_round_trips_and_never_lowered(round_trip, given, expected):
    assert fit_to_round_trip(round_trip, given) == expected


def test_what_was_raised_is_named_with_before_and_after():
    assert raised(Timing(5, 5, 3), Timing(6, 10, 3)) == ("dial_timeout=5s -> 6s", "request_timeout=5s -> 10s")
    assert raised(Timing(0, 0, 3), Timing(6, 10, 8)) == ("lease_ttl=3s -> 8s",)  # 0: not asked about


@pytest.mark.etcd
@pytest.mark.slow
def test_a_node_behind_a_second_of_latency_connects_fits_its_timeouts_and_joins(etcd_server, caplog):
    host, port = etcd_server.endpoints.split("://")[-1].rsplit(":", 1)
    credentials = {"user": ROOT_USER, "password": etcd_server.options.password}
    settings = RendezvousSettings("slow-job", 1, 1, lease_ttl=3.0, last_call_timeout=0.1, join_timeout=60.0)
    with LatencyProxy((host, int(port)), delay=1.0) as proxy, caplog.at_level(logging.WARNING):
        handler = create_handler(spec_from_conf("etcd", f"http://{proxy.address}", credentials), settings, "127.0.0.1")
        try:
            assert handler.settings.lease_ttl >= 8.0
            assert handler._backend.config.request_timeout >= 10.0
            info = handler.next_rendezvous()
            assert (info.round, info.group_world_size) == (0, 1)
            assert handler.membership().change is None  # the lease held through the join
        finally:
            handler.shutdown()
    lines = [record.getMessage() for record in caplog.records if "round trips" in record.getMessage()]
    assert len(lines) == 1 and "lease_ttl=3s -> " in lines[0] and "request_timeout=5s -> " in lines[0], lines
