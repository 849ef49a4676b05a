"""One client of the TCP store server as the server sees it: the handshake, then its frames in order.

Sending is bounded (a response over the frame limit becomes an error reply; a reader too slow
for ``max_write_buffer_bytes`` is dropped); what the peer does wrong costs only this connection.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol, Sequence, cast

from backends.api import WatchEvent
from backends.errors import ProtocolError
from backends.tcp.limits import PRE_AUTH_FRAME_BYTES, StoreLimits
from backends.tcp.peerlog import PeerLog
from backends.tcp.protocol import (
    MAGIC,
    PROTOCOL_VERSION,
    Frame,
    FrameDecoder,
    encode_frame,
    error_to_wire,
    event_batches,
    event_to_wire,
    tune_socket,
)

__all__ = ["HELLO_MAX_FRAME_BYTES", "PeerConnection", "PeerHost"]

log = logging.getLogger(__name__)

HELLO_MAX_FRAME_BYTES = 64 * 1024
"""The smallest frame limit a server or client may set."""

_READ_BUFFER_BYTES = 64 * 1024
_PRE_AUTH_READ_BUFFER_BYTES = 4 * 1024


class PeerHost(Protocol):
    """What a connection needs of its server (:class:`~backends.tcp.store_server.StoreServer`)."""

    address: str
    peer_log: PeerLog
    limits: StoreLimits
    handshake_timeout: float
    max_frame_bytes: int
    max_request_bytes: int

    def register(self, connection: "PeerConnection") -> bool: ...
    def authenticated(self, connection: "PeerConnection") -> None: ...
    def unregister(self, connection: "PeerConnection") -> None: ...
    def token_accepted(self, token: object) -> bool: ...
    def hello(self) -> dict[str, Any]: ...
    def handle(self, connection: "PeerConnection", frame: Frame) -> None: ...


class PeerConnection(asyncio.BufferedProtocol):
    """One client: the handshake, then frames handed to the server in order.

    A buffered protocol, so each read lands in one reused buffer instead of a fresh 256 KiB
    allocation (which costs mmap/munmap system calls per request).
    """

    def __init__(self, server: PeerHost) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._magic = b""
        self._decoder = FrameDecoder(PRE_AUTH_FRAME_BYTES)
        self._authenticated = False
        self._closing = False
        self._handshake_timer: asyncio.TimerHandle | None = None
        self.max_out_frame = server.max_frame_bytes
        self.peer = "unknown peer"
        self.watch_count = 0
        self._buffer = memoryview(bytearray(_PRE_AUTH_READ_BUFFER_BYTES))  # grown after the handshake

    # -- asyncio callbacks -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # create_server gives stream transports
        sock = transport.get_extra_info("socket")
        if sock is not None:
            tune_socket(sock)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if not self._server.register(self):
            return
        loop = asyncio.get_running_loop()
        self._handshake_timer = loop.call_later(self._server.handshake_timeout, self._handshake_expired)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        if self._closing:
            return
        try:
            self._receive(self._buffer[:nbytes])
        except ProtocolError as error:
            self._server.peer_log.note("protocol" if self._authenticated else "handshake", logging.WARNING,
                                       "elastic-store %s: dropping %s: %s", self._server.address, self.peer, error)
            if self._authenticated:  # a client of ours: say why before hanging up
                self.refuse(None, error)
            else:
                self.abort()
        except Exception:
            log.exception("elastic-store %s: dropping %s after an internal error", self._server.address, self.peer)
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        self._server.unregister(self)
        if self._decoder.pending_bytes:
            self._server.peer_log.note("mid-frame", logging.INFO, "elastic-store %s: %s left mid-frame",
                                       self._server.address, self.peer)
        self._server.peer_log.note("disconnected", logging.DEBUG, "elastic-store %s: %s disconnected (%s)",
                                   self._server.address, self.peer, exc)

    # -- sending -----------------------------------------------------------------------------
    def send(self, header: dict[str, Any], parts: Sequence[bytes] = (), *, magic: bool = False) -> None:
        """Send one frame; a response over the frame limit becomes an error reply instead."""
        if self._closing or self._transport is None:
            return
        data = encode_frame(header, parts)
        if len(data) - 4 > self.max_out_frame:
            message = f"The response is {len(data)} bytes, over the {self.max_out_frame}-byte frame limit."
            ids: dict[str, Any] = {name: header[name] for name in ("i", "w") if name in header}
            data = encode_frame({**ids, "err": "internal", "msg": message})
        self._transport.write(MAGIC + data if magic else data)
        queued = self._transport.get_write_buffer_size()
        if queued > max(self._server.limits.max_write_buffer_bytes, len(data)):
            self._server.peer_log.note("slow-reader", logging.WARNING, "elastic-store %s: dropping %s: it reads too "
                                       "slowly (%d bytes queued for it, over the max_write_buffer_bytes limit)",
                                       self._server.address, self.peer, queued)
            self.abort()

    def push_events(self, watch_id: int, events: Sequence[WatchEvent]) -> None:
        batch_bytes = min(self.max_out_frame, self._server.limits.max_write_buffer_bytes) // 2
        for batch in event_batches(events, batch_bytes):
            parts: list[bytes] = []
            items = [event_to_wire(event, parts) for event in batch]
            self.send({"w": watch_id, "ev": items}, parts)

    def abort(self) -> None:
        self._closing = True
        if self._transport is not None:
            self._transport.abort()

    # -- receiving ---------------------------------------------------------------------------
    def _receive(self, data: memoryview) -> None:
        if len(self._magic) < len(MAGIC):
            missing = len(MAGIC) - len(self._magic)
            self._magic += bytes(data[:missing])
            data = data[missing:]
            if not MAGIC.startswith(self._magic):
                raise ProtocolError(f"not an elastic-store client (it sent {self._magic!r})")
            if len(self._magic) < len(MAGIC):
                return
        for frame in self._decoder.feed(data):
            if self._closing:
                return
            if self._authenticated:
                self._server.handle(self, frame)
            else:
                self._hello(frame)

    def _hello(self, frame: Frame) -> None:
        header = frame.header
        if header.get("v") != PROTOCOL_VERSION:
            self.refuse("version", f"The store speaks protocol version {PROTOCOL_VERSION}, the client "
                         f"{header.get('v')!r}; use matching etcd-elastic versions.")
            return
        if not self._server.token_accepted(header.get("token")):
            self._server.peer_log.note("auth", logging.WARNING, "elastic-store %s: %s presented a wrong or missing "
                                       "token", self._server.address, self.peer)
            self.refuse("auth", "The store rejected the token (wrong or missing); "
                                 "pass the token the store was started with.")
            return
        peer_max = header.get("max_frame")
        if isinstance(peer_max, int) and HELLO_MAX_FRAME_BYTES <= peer_max < self.max_out_frame:
            self.max_out_frame = peer_max
        self._authenticated = True
        self._server.authenticated(self)
        self._decoder.max_frame_bytes = self._server.max_request_bytes
        self._decoder.max_header_bytes = self._server.limits.max_header_bytes
        self._buffer = memoryview(bytearray(_READ_BUFFER_BYTES))
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        self.send(self._server.hello(), magic=True)

    def refuse(self, code: str | None, reason: str | BaseException) -> None:
        """Tell the peer why in an error frame without a request id, then close.

        ``code`` None takes the code from ``reason`` (an exception). Before the handshake the
        frame follows :data:`MAGIC`, as a handshake answer would.
        """
        fields = error_to_wire(reason) if code is None else {"err": code, "msg": str(reason)}
        self.send(fields, magic=not self._authenticated)
        self._closing = True
        if self._transport is not None:
            self._transport.close()

    def _handshake_expired(self) -> None:
        if not self._authenticated and not self._closing:
            self._server.peer_log.note("handshake-timeout", logging.WARNING, "elastic-store %s: %s did not complete "
                                       "the handshake in time", self._server.address, self.peer)
            self.abort()
