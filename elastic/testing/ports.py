"""A free TCP port for a test's server that an outgoing connection will not take first.

A port from ``bind(port 0)`` lies in the kernel's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``), which is where every outgoing connection takes
its source port. Between the probe and the server's own bind (a launcher's start, seconds), any
connect() on the machine may take it: the server's bind then fails and a client connecting to
it is refused (seen once in CI: two c10d agents, both "Connection refused"). So pick a port
below that range instead, checked free by binding it.
"""

from __future__ import annotations

import random
import socket

__all__ = ["free_port"]

_LOWEST = 10000
_ATTEMPTS = 200


def _ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """The lowest ephemeral port (32768 when the range cannot be read: Linux's default)."""
    try:
        with open(path) as range_file:
            return int(range_file.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1", rng: random.Random | None = None) -> int:
    """A port on ``host`` that is free now and outside the ephemeral range when it can be.

    Falls back to the kernel's choice when no port below the range is free after a bounded
    number of tries, or the range starts too low to leave room.
    """
    rng = rng or random.SystemRandom()
    high = _ephemeral_low() - 1
    if high - _LOWEST >= 1000:
        for _ in range(_ATTEMPTS):
            port = rng.randint(_LOWEST, high)
            with socket.socket() as probe:
                try:
                    probe.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]
