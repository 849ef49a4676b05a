"""Lease renewals on one persistent LeaseKeepAlive stream per endpoint, shared by every lease.

etcd renews leases over a bidirectional stream: the client sends a lease id, the server
answers with the id and its remaining TTL (0 when the lease is gone). Opening a stream per
renewal costs a new HTTP/2 stream, a gRPC request thread and a cancel each time; a process
hosting hundreds of sessions renews a few hundred leases every few seconds. Here each endpoint
gets one long-lived stream; a renewal puts its request on it and waits for the answer with
its id, which one reader thread hands out. A broken stream fails the renewals waiting on it
(the caller's retry policy sends them again, on a new stream) and is replaced on next use.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import grpc
from etcd3 import etcdrpc

from backends.errors import BackendClosedError, BackendConnectionError, BackendTimeoutError
from backends.etcd.connection import CallOptions, EndpointChannel
from backends.etcd.request_queue import RequestQueue

log = logging.getLogger(__name__)


class _Renewal:
    """One caller waiting for the answer to its keepalive."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.response: Any = None
        self.error: BaseException | None = None


class KeepAliveStream:
    """One open LeaseKeepAlive stream on one endpoint and the renewals waiting on it."""

    def __init__(self, channel: EndpointChannel, metadata: tuple[tuple[str, str], ...]) -> None:
        self.channel = channel
        self.metadata = metadata
        self._requests = RequestQueue()
        self._lock = threading.Lock()
        self._waiting: dict[int, list[_Renewal]] = {}
        self._broken: BaseException | None = None
        self._call = channel.lease.LeaseKeepAlive(self._requests, metadata=metadata, wait_for_ready=False)
        self._reader = threading.Thread(target=self._read, name=f"etcd-keepalive {channel}", daemon=True)
        self._reader.start()

    @property
    def broken(self) -> bool:
        return self._broken is not None

    @property
    def reading(self) -> bool:
        """Whether the reader thread is still running (it ends once the stream ends)."""
        return self._reader.is_alive()

    def renew(self, lease_id: int, timeout: float) -> Any:
        """Send one keepalive for ``lease_id`` and return etcd's answer.

        Raises:
            grpc.RpcError: the stream broke (the caller translates and retries).
            BackendTimeoutError: no answer within ``timeout`` (the stream is then closed).
        """
        renewal = _Renewal()
        with self._lock:
            if self._broken is not None:
                raise self._broken
            self._waiting.setdefault(lease_id, []).append(renewal)
        self._requests.put(etcdrpc.LeaseKeepAliveRequest(ID=lease_id))
        if not renewal.done.wait(timeout):
            with self._lock:
                waiters = self._waiting.get(lease_id, [])
                if renewal in waiters:
                    waiters.remove(renewal)
            self.close()  # a stream that does not answer is not trusted again
            raise BackendTimeoutError(
                f"etcd at {self.channel} did not answer the keepalive of lease {lease_id:x} within {timeout:.3g}s."
            )
        if renewal.error is not None:
            raise renewal.error
        return renewal.response

    def close(self) -> None:
        """Half-close and cancel the stream; renewals waiting on it fail; idempotent."""
        self._requests.put(None)
        self._call.cancel()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the reader thread to end after :meth:`close`; True if it did."""
        if self._reader is threading.current_thread():
            return True
        self._reader.join(timeout)
        return not self._reader.is_alive()

    def _read(self) -> None:
        error: BaseException
        try:
            for response in self._call:
                with self._lock:
                    renewals = self._waiting.pop(response.ID, [])
                for renewal in renewals:
                    renewal.response = response
                    renewal.done.set()
            error = BackendConnectionError(f"etcd at {self.channel} ended the keepalive stream; retry the renewal.")
        except grpc.RpcError as rpc_error:
            error = rpc_error
        except Exception as unexpected:  # a bug must not leave renewals waiting
            log.exception("etcd keepalive stream on %s: internal error", self.channel)
            error = unexpected
        with self._lock:
            self._broken = error
            waiting, self._waiting = self._waiting, {}
        for renewals in waiting.values():
            for renewal in renewals:
                renewal.error = error
                renewal.done.set()


class KeepAliveStreams:
    """The keepalive stream of each endpoint, opened on first use and replaced when broken."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[EndpointChannel, KeepAliveStream] = {}
        self._ended: list[KeepAliveStream] = []  # closed streams whose reader may still run
        self._closed = False

    def renew(self, channel: EndpointChannel, options: CallOptions, lease_id: int) -> Any:
        """An invoke function for :meth:`EtcdConnection.call`: renew ``lease_id`` on ``channel``.

        Raises:
            grpc.RpcError, BackendTimeoutError: see :meth:`KeepAliveStream.renew`.
            BackendClosedError: the client was closed.
        """
        return self._stream(channel, options.metadata).renew(lease_id, options.timeout)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            streams, self._streams = list(self._streams.values()), {}
            self._ended.extend(streams)
        for stream in streams:
            stream.close()

    def join(self, deadline: float, clock: Callable[[], float] = time.monotonic) -> bool:
        """Wait until ``deadline`` (on ``clock``) for the readers of every stream ended so far
        (by :meth:`close` or replaced); True if every one did."""
        with self._lock:
            ended = list(self._ended)
        return all(stream.join(max(0.0, deadline - clock())) for stream in ended)

    def _stream(self, channel: EndpointChannel, metadata: tuple[tuple[str, str], ...]) -> KeepAliveStream:
        with self._lock:
            if self._closed:
                raise BackendClosedError("etcd keepalive: the client was closed; open a new EtcdBackend.")
            stream = self._streams.get(channel)
            if stream is not None and (stream.broken or stream.metadata != metadata):
                stream.close()  # broken, or opened with a token that has since been replaced
                self._ended = [old for old in self._ended if old.reading] + [stream]
                stream = None
            if stream is None:
                stream = self._streams[channel] = KeepAliveStream(channel, metadata)
            return stream
