"""Fit the timeouts to the round trip to etcd, measured once when the node connects.

A timeout that fits loopback does not fit a link with a second of latency each way: a call that
must reconnect first needs HTTP/2's greeting (2 round trips) and its answer (1 more), and a
lease renewed one round trip apart needs a TTL of several round trips to hold through a slower
moment. With 1 s of latency the 5 s defaults left a reconnecting call no room, and a 3 s lease
none. So the node measures the round trip once (a tiny read on a connected channel, see
:meth:`backends.etcd.EtcdBackend.round_trip`) and raises, for itself, whatever falls below:

* ``dial_timeout`` to :data:`ROUND_TRIPS_PER_DIAL` round trips,
* ``request_timeout`` to :data:`ROUND_TRIPS_PER_CALL`,
* ``lease_ttl`` to :data:`ROUND_TRIPS_PER_LEASE`,

rounded up to whole seconds, and says so in one line (:func:`describe`) naming the measured
round trip and the options to set. Nothing is ever lowered. Pure: :func:`fit_to_round_trip`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ROUND_TRIPS_PER_DIAL = 3
"""A connection: TCP (1 round trip) and HTTP/2's greeting (2)."""

ROUND_TRIPS_PER_CALL = 5
"""A call that reconnects first (3 round trips, see above), its answer (1), and one to spare."""

ROUND_TRIPS_PER_LEASE = 4
"""Renewals arrive one round trip apart (:mod:`backends.session`); a lease outlives 3 late ones."""


@dataclass(frozen=True)
class Timing:
    """The timeouts that depend on the link: seconds each."""

    dial: float
    request: float
    lease_ttl: float


def fit_to_round_trip(round_trip: float, given: Timing) -> Timing:
    """``given``, with each timeout raised to its share of round trips if it is below (see the module docstring)."""
    def at_least(value: float, round_trips: int) -> float:
        needed = math.ceil(round_trips * round_trip)
        return float(needed) if needed > value else value

    return Timing(at_least(given.dial, ROUND_TRIPS_PER_DIAL), at_least(given.request, ROUND_TRIPS_PER_CALL),
                  at_least(given.lease_ttl, ROUND_TRIPS_PER_LEASE))


def raised(given: Timing, fitted: Timing) -> tuple[str, ...]:
    """What :func:`fit_to_round_trip` raised, as ``name=before -> after`` (a timeout of 0 is not asked about)."""
    return tuple(f"{name}={before:g}s -> {after:g}s" for name, before, after in (
        ("dial_timeout", given.dial, fitted.dial), ("request_timeout", given.request, fitted.request),
        ("lease_ttl", given.lease_ttl, fitted.lease_ttl)) if before and after != before)


def describe(round_trip: float, changes: tuple[str, ...], endpoint: str) -> str:
    """The one line about the timeouts raised for a slow link."""
    return (f"etcd at {endpoint} answers in {round_trip:.2f}s round trips, too slowly for the configured timeouts; "
            f"this node raised {', '.join(changes)}. Check the network to etcd, or set them with --rdzv-conf.")
