"""The TLS files of an etcd client (CA bundle, client certificate, client key), read again before
each new connection.

gRPC takes a channel's credentials as bytes, once; the paths are ours. Certificates rotate by
rewriting those files (a new CA appended to the bundle, a new client certificate) and restarting
etcd with its new certificate: a client that read the files once keeps trusting only the old
CA, and its handshakes fail for good. So the connection calls :meth:`TlsFiles.refresh` whenever
a channel is not connected (a reconnect, a failed handshake, every retry of one) and opens the
channel anew when the bytes changed
(:meth:`~backends.etcd.connection.EndpointChannel.renew_credentials`).

A read that finds a change is logged at INFO, naming the file and when it changed; one that
finds none, at DEBUG. A file that cannot be read, or whose new bytes hold no PEM block (a
rewrite caught half-way), keeps its last contents and is read again next time (one warning).
:meth:`TlsFiles.describe` says which file was read when, for the message of a failed handshake.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import grpc

from backends.errors import EndpointError
from backends.untrusted import read_small_file

log = logging.getLogger(__name__)

MAX_TLS_FILE_BYTES = 4 * 1024 * 1024
"""Largest CA bundle, certificate or key file read (a system CA bundle is ~200 KiB)."""

CA_FILE, CLIENT_CERT, CLIENT_KEY = "CA file", "client certificate file", "client key file"
"""What each file is called in messages (and the keys of :class:`TlsFiles`' reads)."""

_PEM_MARKER = b"-----BEGIN "


@dataclass(frozen=True)
class FileRead:
    """One TLS file as last read.

    Attributes:
        role: what the file is (:data:`CA_FILE`, :data:`CLIENT_CERT`, :data:`CLIENT_KEY`).
        path: the path it is read from (as given).
        data: its bytes.
        modified: its modification time (wall clock) at that read.
        read_at: when it was last read (wall clock).
    """

    role: str
    path: str
    data: bytes
    modified: float
    read_at: float

    def describe(self) -> str:
        """``the CA file /etc/etcd/ca.pem (read at 2026-11-29 10:21:07, changed at 2026-11-29 10:20:00)``."""
        return f"the {self.role} {self.path} (read at {wall_time(self.read_at)}, changed at {wall_time(self.modified)})"


def wall_time(seconds: float) -> str:
    """A wall-clock time for messages: local time, to the second."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def takes(old: bytes, new: bytes) -> bool:
    """Whether a file read as ``new`` replaces its contents ``old``: other bytes with a PEM block
    (a file caught half-way through a rewrite, empty or cut before its first block, is not). Pure."""
    return new != old and _PEM_MARKER in new


class TlsFiles:
    """The TLS files of one etcd client, as last read, and the credentials built from them.

    Thread-safe. :attr:`generation` grows by one each time :meth:`refresh` finds a change.

    Raises (from the constructor):
        EndpointError: a file cannot be read.
    """

    def __init__(self, ca_cert: str | Path | None, client_cert: str | Path | None, client_key: str | Path | None,
                 clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        given = {CA_FILE: ca_cert, CLIENT_CERT: client_cert, CLIENT_KEY: client_key}
        self._reads = {role: self._first_read(role, str(path)) for role, path in given.items() if path is not None}
        self._problems: dict[str, str] = {}  # each file's current read problem, warned about once
        self.generation = 0
        self._credentials = self._build()

    @property
    def credentials(self) -> tuple[int, grpc.ChannelCredentials]:
        """The current generation and the credentials built from the files as last read."""
        with self._lock:
            return self.generation, self._credentials

    def refresh(self) -> bool:
        """Read every file again; True when one changed (new credentials, the next generation)."""
        with self._lock:
            found = False
            for role, old in list(self._reads.items()):
                read = self._reads[role] = self._reread(old)
                if read.data != old.data:
                    found = True
                    log.info("etcd: re-read the %s %s (changed at %s); new connections use it", role, read.path,
                             wall_time(read.modified))
            if found:
                self.generation += 1
                self._credentials = self._build()
            return found

    def describe(self) -> str:
        """Which file was read when: ``the CA file /x (read at ..., changed at ...); the client ...``."""
        with self._lock:
            reads = list(self._reads.values())
        if not reads:
            return "no TLS file (the system's CA certificates)"
        return "; ".join(read.describe() for read in reads)

    # -- reading -----------------------------------------------------------------------------
    def _first_read(self, role: str, path: str) -> FileRead:
        try:
            data, modified = _read(path)
        except ValueError as error:
            raise EndpointError(f"Cannot read the etcd TLS file {path[:200]!r}: {error}.") from None
        return FileRead(role, path, data, modified, self._clock())

    def _reread(self, old: FileRead) -> FileRead:
        """The file read now: its new contents, or ``old`` when they cannot be taken (or did not change)."""
        try:
            data, modified = _read(old.path)
        except ValueError as error:
            self._note_problem(old, f"cannot be read ({error})")
            return old
        if data != old.data and not takes(old.data, data):
            self._note_problem(old, "holds no PEM block (a rewrite in progress?)")
            return old
        self._problems.pop(old.role, None)
        read = FileRead(old.role, old.path, data, modified, self._clock())
        if data == old.data:
            log.debug("etcd: re-read %s: unchanged", read.describe())
        return read

    def _note_problem(self, old: FileRead, problem: str) -> None:
        if self._problems.get(old.role) != problem:
            log.warning("etcd: the %s %s %s; keeping what was read at %s and reading it again before the next "
                        "connection", old.role, old.path, problem, wall_time(old.read_at))
        self._problems[old.role] = problem

    def _build(self) -> grpc.ChannelCredentials:
        def data(role: str) -> bytes | None:
            read = self._reads.get(role)
            return read.data if read is not None else None

        return grpc.ssl_channel_credentials(root_certificates=data(CA_FILE), private_key=data(CLIENT_KEY),
                                            certificate_chain=data(CLIENT_CERT))


def _read(path: str) -> tuple[bytes, float]:
    """The bytes of ``path`` and its modification time. Raises ValueError (one short line)."""
    data = read_small_file(path, max_bytes=MAX_TLS_FILE_BYTES)
    try:
        modified = os.stat(path).st_mtime
    except OSError as error:
        raise ValueError(error.strerror or str(error)) from None
    return data, modified
