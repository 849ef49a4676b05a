"""KeepAliveStreams.join waits for every reader it started, the replaced streams' ones included.

A fake LeaseKeepAlive call stands in for the channel: an iterator that answers each request
with its lease ID and, once cancelled, ends only after a delay, as a gRPC call that is still
busy inside gRPC does. What is tested is which reader threads close() and join() wait for.
"""

from __future__ import annotations

import queue
import threading
import time

import grpc
from etcd3 import etcdrpc

from backends.etcd.connection import CallOptions
from backends.etcd.keepalive import KeepAliveStreams

LEAVE_DELAY_S = 0.5
"""How long a cancelled fake call keeps its reader inside it (the first call of a lease: twice that)."""


class CancelledCall(grpc.RpcError):
    pass


class FakeCall:
    """Answers every request with its lease ID; after cancel() ends its reader LEAVE_DELAY_S later."""

    def __init__(self, requests, leave_delay: float) -> None:
        self._events: queue.Queue = queue.Queue()
        self._leave_delay = leave_delay
        threading.Thread(target=self._answer, args=(requests,), daemon=True).start()

    def _answer(self, requests) -> None:
        for request in requests:  # ends at the half-close (KeepAliveStream.close puts None)
            self._events.put(etcdrpc.LeaseKeepAliveResponse(ID=request.ID, TTL=5))

    def __iter__(self):
        return self

    def __next__(self):
        event = self._events.get(timeout=30)
        if event is None:
            time.sleep(self._leave_delay)
            raise CancelledCall()
        return event

    def cancel(self) -> None:
        self._events.put(None)


class FakeLease:
    def __init__(self) -> None:
        self.calls: list[FakeCall] = []

    def LeaseKeepAlive(self, requests, metadata, wait_for_ready):  # noqa: N802 - gRPC's stub name
        call = FakeCall(requests, LEAVE_DELAY_S * (2 if not self.calls else 1))
        self.calls.append(call)
        return call


class FakeChannel:
    def __init__(self) -> None:
        self.lease = FakeLease()

    def __str__(self) -> str:
        return "fake:1"


def renew(streams: KeepAliveStreams, channel: FakeChannel, token: str, lease_id: int) -> None:
    answer = streams.renew(channel, CallOptions(timeout=5.0, metadata=(("token", token),)), lease_id)
    assert answer.ID == lease_id


def readers() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "etcd-keepalive fake:1"]


def test_join_waits_for_the_reader_of_a_stream_replaced_before_close():
    streams = KeepAliveStreams()
    channel = FakeChannel()
    renew(streams, channel, "token-1", 7)
    renew(streams, channel, "token-2", 7)  # a new token: the first stream is closed and replaced
    assert len(channel.lease.calls) == 2
    streams.close()
    assert streams.join(time.monotonic() + 5)
    assert readers() == []


def test_join_says_false_when_a_reader_outlives_the_deadline():
    streams = KeepAliveStreams()
    channel = FakeChannel()
    renew(streams, channel, "token-1", 7)
    streams.close()
    assert not streams.join(time.monotonic() + LEAVE_DELAY_S / 10)
    assert streams.join(time.monotonic() + 5)
