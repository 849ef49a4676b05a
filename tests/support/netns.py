"""A network namespace joined to the host by a veth pair, for partition tests (root only).

:class:`NamespaceLink` creates a namespace ``ee-<hex>`` and a veth pair with a ``/30`` subnet
picked from ``10.200.0.0/13`` that no host interface uses: the host end gets ``.1``
(:attr:`NamespaceLink.host_addr`), the namespace end ``.2`` (:attr:`NamespaceLink.ns_addr`).
A process started with :meth:`NamespaceLink.popen` runs inside (``ip netns exec`` execs it,
so the PID is the command's own) and reaches the host only over the veth: services it must
reach (etcd, peers' workers) listen on the host end's address.

:meth:`NamespaceLink.cut` takes the namespace end down: the namespace loses its route to the
host at once (its packets fail, the host's to it vanish), while the host end keeps its
address, so host processes bound to it keep working among themselves. :meth:`NamespaceLink.heal`
brings it back up and waits until the host end answers a TCP connect from inside.

Nothing outside the namespace and the pair is touched (no iptables, no host routes).
:meth:`NamespaceLink.close` deletes the namespace (which deletes the pair) and is idempotent;
stop the processes inside first. Requires root and ``ip`` (iproute2).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import random
import shutil
import subprocess
import sys
import time
import uuid
import weakref
from typing import Any

log = logging.getLogger(__name__)

POOL = ipaddress.ip_network("10.200.0.0/13")


class NamespaceError(RuntimeError):
    """A namespace or veth could not be created or changed; the message names the command."""


class NamespaceLink:
    """A network namespace and the veth pair joining it to the host; see the module docstring.

    Raises (from the constructor):
        NamespaceError: not root, no ``ip``, or a command failed (whatever was made is removed).
    """

    def __init__(self) -> None:
        if os.geteuid() != 0:
            raise NamespaceError("Network namespaces need root (CI runs as root); run the chaos suite as root.")
        if shutil.which("ip") is None:
            raise NamespaceError("`ip` (iproute2) is not on PATH; apt-get install iproute2.")
        tag = uuid.uuid4().hex[:8]
        self.name = f"ee-{tag}"
        self.host_if = f"ee{tag}h"  # interface names: at most 15 characters
        self.ns_if = f"ee{tag}n"
        subnet = _free_subnet()
        self.host_addr = str(subnet.network_address + 1)
        self.ns_addr = str(subnet.network_address + 2)
        self.prefix = subnet.prefixlen
        self._finalizer = weakref.finalize(self, _delete, self.name, self.host_if)
        try:
            _ip("netns", "add", self.name)
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if, "netns", self.name)
            _ip("addr", "add", f"{self.host_addr}/{self.prefix}", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            _ip("-n", self.name, "addr", "add", f"{self.ns_addr}/{self.prefix}", "dev", self.ns_if)
            _ip("-n", self.name, "link", "set", "lo", "up")
            _ip("-n", self.name, "link", "set", self.ns_if, "up")
        except BaseException:
            self.close()
            raise
        log.info("Created namespace %s (%s) joined by %s (%s)", self.name, self.ns_addr, self.host_if, self.host_addr)

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` wrapped to run inside the namespace (same PID: ``ip netns exec`` execs it)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def popen(self, argv: list[str], **kwargs: Any) -> "subprocess.Popen[bytes]":
        """Start ``argv`` inside the namespace; ``kwargs`` go to :class:`subprocess.Popen`."""
        return subprocess.Popen(self.command(argv), **kwargs)

    def cut(self) -> float:
        """Take the namespace end down (a partition); the wall time it happened."""
        _ip("-n", self.name, "link", "set", self.ns_if, "down")
        at = time.time()
        log.info("Cut namespace %s from the host", self.name)
        return at

    def heal(self, probe_port: int | None = None, timeout: float = 10.0) -> float:
        """Bring the namespace end up; with ``probe_port``, wait until a TCP connect from inside
        to the host end's port succeeds. Returns the wall time the link went up.

        Raises:
            NamespaceError: the command failed or the probe did not connect within ``timeout``.
        """
        _ip("-n", self.name, "link", "set", self.ns_if, "up")
        at = time.time()
        if probe_port is not None:
            self._probe(probe_port, timeout)
        log.info("Healed namespace %s", self.name)
        return at

    def close(self) -> None:
        """Delete the namespace and the pair; idempotent."""
        self._finalizer()

    def __enter__(self) -> "NamespaceLink":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _probe(self, port: int, timeout: float) -> None:
        code = (f"import socket,sys,time\nend=time.monotonic()+{timeout}\n"
                f"while time.monotonic()<end:\n"
                f"  try: socket.create_connection(('{self.host_addr}',{port}),timeout=0.5).close(); sys.exit(0)\n"
                f"  except OSError: time.sleep(0.05)\nsys.exit(1)")
        result = subprocess.run(self.command([sys.executable, "-c", code]), capture_output=True, timeout=timeout + 5)
        if result.returncode != 0:
            raise NamespaceError(f"{self.host_addr}:{port} not reachable from namespace {self.name} "
                                 f"within {timeout}s of healing the link.")


def _ip(*args: str) -> None:
    """Run ``ip ARGS``. Raises NamespaceError with the command and its stderr on failure."""
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise NamespaceError(f"`ip {' '.join(args)}` failed ({result.returncode}): {result.stderr.strip()}")


def _free_subnet() -> ipaddress.IPv4Network:
    """A random /30 of :data:`POOL` that overlaps no address configured on the host."""
    used = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
    taken = [ipaddress.ip_interface(word).network for line in used.splitlines()
             for word in line.split() if "/" in word and word[0].isdigit()]
    for _ in range(100):
        offset = random.randrange(POOL.num_addresses // 4) * 4
        candidate = ipaddress.ip_network(f"{POOL.network_address + offset}/30")
        if not any(candidate.overlaps(network) for network in taken):
            return candidate
    raise NamespaceError(f"no free /30 in {POOL} after 100 tries.")


def _delete(name: str, host_if: str) -> None:
    """Remove the namespace (and with it the veth pair) and the host end if it is left."""
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    if subprocess.run(["ip", "link", "show", host_if], capture_output=True, timeout=10).returncode == 0:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=30)
