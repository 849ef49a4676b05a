"""One node of the churn test (tests/rendezvous/test_churn.py), run as its own process.

    python churn_node.py '<json spec>'

Loops like an agent: ``next_rendezvous()``, report the result, wait until the handler's
``on_change`` callback says its membership changed, repeat. Every report is one JSON line on stdout:

    {"kind": "round", "node", "round", "rank", "world", "members", "waited", "lease", "t"}
    {"kind": "changed", "node", "round", "reason", "t"}
    {"kind": "error", "node", "error", "waited", "t"}      (then it exits 1)
    {"kind": "left", "node", "t"}                           (after SIGTERM and a clean shutdown)

``t`` is CLOCK_MONOTONIC, shared by every process on the machine. SIGTERM is a clean leave:
the handler shuts down (its key and lease are deleted) and the process exits 0.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from elastic.rendezvous.handler import NodeSpec, RendezvousHandler  # noqa: E402
from elastic.rendezvous.settings import RendezvousSettings  # noqa: E402


class _Leave(BaseException):
    """Raised in the main thread by SIGTERM: leave cleanly."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise _Leave()


def report(**fields: object) -> None:
    print(json.dumps({**fields, "t": time.monotonic()}), flush=True)


def open_backend(spec: dict):
    if spec["backend"] == "etcd":
        from backends.etcd import EtcdBackend, EtcdConfig

        return EtcdBackend(EtcdConfig(endpoints=spec["endpoint"], user=spec.get("user"), password=spec.get("password")))
    from backends.tcp.client import TcpStoreBackend, TcpStoreConfig

    return TcpStoreBackend(TcpStoreConfig(spec["endpoint"], token=spec.get("token")))


def main() -> int:
    spec = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s {spec['node']} %(levelname)s %(name)s: %(message)s")
    settings = RendezvousSettings(
        spec["run_id"], spec["min_nodes"], spec["max_nodes"], namespace=spec["namespace"],
        join_timeout=spec["join_timeout"], last_call_timeout=spec["last_call_timeout"], lease_ttl=spec["lease_ttl"],
    )
    node = NodeSpec("127.0.0.1", node_id=spec["node"])
    handler = RendezvousHandler(settings, open_backend(spec), node, owns_backend=True)
    changed = threading.Event()
    handler.on_change(changed.set)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        while True:
            started = time.monotonic()
            try:
                info = handler.next_rendezvous()
            except Exception as error:  # reported; the test fails on any error
                report(kind="error", node=spec["node"], error=repr(error), waited=time.monotonic() - started)
                return 1
            lease = handler._membership.lease_id  # tells the test whether the node rejoined on a new lease
            report(kind="round", node=spec["node"], round=info.round, rank=info.group_rank,
                   world=info.group_world_size, members=[member.node_id for member in info.members],
                   waited=time.monotonic() - started, lease=lease)
            while handler.membership().change is None:
                changed.wait(1.0)
                changed.clear()
            report(kind="changed", node=spec["node"], round=info.round, reason=handler.membership().reason)
    except _Leave:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        handler.shutdown()
        report(kind="left", node=spec["node"])
        return 0


if __name__ == "__main__":
    sys.exit(main())
