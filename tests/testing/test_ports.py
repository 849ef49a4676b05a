"""free_port: a free port below the ephemeral range, where no outgoing connection takes it."""

from __future__ import annotations

import random
import socket

from elastic.testing import ports


def test_the_port_is_free_and_below_the_ephemeral_range():
    low = ports._ephemeral_low()
    for _ in range(20):
        port = ports.free_port()
        assert ports._LOWEST <= port < low
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_returned(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        monkeypatch.setattr(ports, "_LOWEST", busy)
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: busy + 1001)

        class FirstTheBusyOne(random.Random):
            calls = 0

            def randint(self, a, b):
                self.calls += 1
                return busy if self.calls == 1 else busy + 1 + super().randint(0, 999)

        assert ports.free_port(rng=FirstTheBusyOne(7)) != busy


def test_a_range_that_starts_too_low_falls_back_to_the_kernels_choice(monkeypatch, tmp_path):
    range_file = tmp_path / "range"
    range_file.write_text("1024\t60999\n")
    assert ports._ephemeral_low(str(range_file)) == 1024
    assert ports._ephemeral_low(str(tmp_path / "missing")) == 32768
    monkeypatch.setattr(ports, "_ephemeral_low", lambda: 1024)
    port = ports.free_port()
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
