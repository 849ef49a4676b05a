"""Another tenant of a shared etcd, for fault tests: writes, compacts, fills the database.

A production etcd is shared. Its other tenants move the store revision, an operator (or etcd's
own ``--auto-compaction-retention``) compacts history every so often, and one runaway tenant can
fill the database until etcd raises its NOSPACE alarm and refuses every write. These tools do
that to a test's etcd, over etcd's gRPC API (the ``etcd3`` stubs), outside the code under test:

* :class:`BusyTenant` puts a key every ``write_every`` seconds and compacts to the current
  revision every ``compact_every`` seconds (as ``etcdctl compact $(rev)`` in a loop), in a
  thread, riding out an etcd that is down (it just tries again); stop it with :meth:`~BusyTenant.stop`
  or a ``with`` block. :attr:`BusyTenant.compactions` counts the compactions that applied.
* :func:`fill_until_nospace` overwrites a few keys with large values until etcd refuses a write
  with "database space exceeded" (start etcd with a small ``--quota-backend-bytes``);
  :func:`nospace_alarmed` says whether the alarm is raised; :func:`clear_nospace` does what the
  operator does: delete the tenant's keys, compact, defragment, disarm the alarm.

Every call has a deadline; nothing here runs after :meth:`BusyTenant.stop` returns.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass

import grpc
from etcd3 import etcdrpc

log = logging.getLogger(__name__)

CALL_TIMEOUT = 5.0
"""Seconds one call to etcd may take."""

NOSPACE_TEXT = "database space exceeded"


def _prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


class BusyTenant:
    """Writes a key every ``write_every`` s and compacts every ``compact_every`` s (see the module docstring).

    Args:
        address: one etcd client address, ``host:port``.
        prefix: where the tenant writes (a unique prefix by default).
    """

    def __init__(self, address: str, *, write_every: float = 0.1, compact_every: float = 2.0,
                 prefix: str | None = None) -> None:
        self.address = address
        self.write_every = write_every
        self.compact_every = compact_every
        self.prefix = (prefix or f"/tenant-{uuid.uuid4().hex[:8]}/").encode()
        self.compactions = 0
        self.writes = 0
        self.last_compacted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="etcd-busy-tenant", daemon=True)

    def start(self) -> "BusyTenant":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop and wait for the thread (idempotent)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=CALL_TIMEOUT * 3)

    def __enter__(self) -> "BusyTenant":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        next_compact = time.monotonic() + self.compact_every
        count = 0
        while not self._stop.is_set():
            with grpc.insecure_channel(self.address) as channel:
                kv = etcdrpc.KVStub(channel)
                while not self._stop.is_set():
                    try:
                        response = kv.Put(etcdrpc.PutRequest(key=self.prefix + str(count % 16).encode(),
                                                             value=str(count).encode()), timeout=CALL_TIMEOUT)
                        count += 1
                        self.writes += 1
                        if time.monotonic() >= next_compact:
                            next_compact = time.monotonic() + self.compact_every
                            revision = response.header.revision
                            kv.Compact(etcdrpc.CompactionRequest(revision=revision), timeout=CALL_TIMEOUT)
                            self.compactions += 1
                            self.last_compacted = revision
                    except grpc.RpcError as error:
                        log.debug("busy tenant on %s: %s", self.address, error)
                        break  # a new channel: etcd may have restarted
                    self._stop.wait(self.write_every)
            self._stop.wait(0.2)


@dataclass(frozen=True)
class Filled:
    """What :func:`fill_until_nospace` did: how many writes and bytes until etcd refused."""

    writes: int
    bytes_written: int
    refusal: str


def fill_until_nospace(address: str, *, prefix: str = "/filler/", value_bytes: int = 512 * 1024,
                       keys: int = 4, timeout: float = 120.0) -> Filled:
    """Overwrite ``keys`` keys with ``value_bytes`` values until etcd says "database space exceeded".

    Raises:
        TimeoutError: etcd still accepted writes after ``timeout`` seconds (no quota set?).
        grpc.RpcError: etcd refused for another reason.
    """
    value = b"x" * value_bytes
    deadline = time.monotonic() + timeout
    writes = 0
    with grpc.insecure_channel(address) as channel:
        kv = etcdrpc.KVStub(channel)
        while time.monotonic() < deadline:
            try:
                kv.Put(etcdrpc.PutRequest(key=f"{prefix}{writes % keys}".encode(), value=value), timeout=CALL_TIMEOUT)
            except grpc.RpcError as error:
                if NOSPACE_TEXT in (error.details() or ""):
                    return Filled(writes, writes * value_bytes, error.details())
                raise
            writes += 1
    raise TimeoutError(f"etcd at {address} still accepted writes after {writes} x {value_bytes} bytes; "
                       "start it with --quota-backend-bytes")


def nospace_alarmed(address: str) -> bool:
    """Whether etcd's NOSPACE alarm is raised."""
    with grpc.insecure_channel(address) as channel:
        response = etcdrpc.MaintenanceStub(channel).Alarm(
            etcdrpc.AlarmRequest(action=etcdrpc.AlarmRequest.GET), timeout=CALL_TIMEOUT)
    return any(alarm.alarm == etcdrpc.NOSPACE for alarm in response.alarms)


def clear_nospace(address: str, *, prefix: str = "/filler/") -> None:
    """The operator's fix: delete the tenant's keys, compact, defragment, disarm every alarm
    (``etcdctl del --prefix``, ``compact``, ``defrag``, ``alarm disarm``)."""
    raw = prefix.encode()
    with grpc.insecure_channel(address) as channel:
        kv = etcdrpc.KVStub(channel)
        maintenance = etcdrpc.MaintenanceStub(channel)
        revision = kv.DeleteRange(etcdrpc.DeleteRangeRequest(key=raw, range_end=_prefix_end(raw)),
                                  timeout=CALL_TIMEOUT).header.revision
        kv.Compact(etcdrpc.CompactionRequest(revision=revision, physical=True), timeout=CALL_TIMEOUT * 6)
        maintenance.Defragment(etcdrpc.DefragmentRequest(), timeout=CALL_TIMEOUT * 6)
        alarms = maintenance.Alarm(etcdrpc.AlarmRequest(action=etcdrpc.AlarmRequest.GET), timeout=CALL_TIMEOUT)
        for alarm in alarms.alarms:
            maintenance.Alarm(etcdrpc.AlarmRequest(action=etcdrpc.AlarmRequest.DEACTIVATE, memberID=alarm.memberID,
                                                   alarm=alarm.alarm), timeout=CALL_TIMEOUT)
