"""The TCP store server's core: one :class:`~backends.kvstate.KVState` served on an asyncio loop.

:class:`StoreServer` runs on a loop you own (:func:`backends.tcp.server.start_server` runs one in
a background thread); each client is a :class:`~backends.tcp.peer.PeerConnection`. The server:

* checks the shared token with :func:`hmac.compare_digest` before anything else;
* answers requests in order per connection (see :mod:`backends.tcp.ops`);
* pushes watch events as changes happen, replaying history first for a watch that starts in
  the past (a compacted start gets an error reply);
* expires leases on a timer set from :meth:`KVState.next_expiry`, so DELETEs go out on time;
* never falls over on a bad peer: garbage, oversized or half frames and abrupt disconnects
  cost only that connection, which is dropped; an authenticated client is told why first. The
  lines peers cause are rate-limited and written off the event loop
  (:class:`~backends.tcp.peerlog.PeerLog`), so a flood neither floods the log nor stalls
  clients on a full stderr pipe;
* bounds what peers can make it hold (:class:`~backends.tcp.limits.StoreLimits`): request
  frames and headers, connections and handshakes in progress, watches per connection, and
  what it queues for slow readers.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from typing import Any, Sequence

from backends.api import WatchEvent
from backends.endpoints import Endpoint
from backends.errors import BackendError, LimitExceededError, ProtocolError
from backends.kvstate import (
    KVState,
)
from backends.tcp.limits import StoreLimits
from backends.tcp.ops import LEASE_OPS, apply_request, field
from backends.tcp.peer import HELLO_MAX_FRAME_BYTES, PeerConnection
from backends.tcp.peerlog import PeerLog
from backends.tcp.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    Frame,
    error_to_wire,
)

__all__ = ["StoreServer"]

log = logging.getLogger(__name__)


class StoreServer:
    """Serves ``state`` to TCP clients on the running asyncio loop.

    Args:
        state: the data; lease timers are set from its clock, which must tick in real seconds.
        token: shared secret clients must present; None accepts every client.
        max_frame_bytes: largest frame sent (a response; requests are bounded by ``limits``).
        handshake_timeout: seconds a new connection has to authenticate.
        limits: bounds on what peers can make the server hold.
    """

    def __init__(
        self,
        state: KVState,
        *,
        token: str | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        handshake_timeout: float = 10.0,
        limits: StoreLimits | None = None,
    ) -> None:
        if max_frame_bytes < HELLO_MAX_FRAME_BYTES:
            raise ValueError(f"The frame limit ({max_frame_bytes}) must be at least {HELLO_MAX_FRAME_BYTES} bytes.")
        self.state = state
        self.limits = limits if limits is not None else StoreLimits()
        self.max_frame_bytes = max_frame_bytes
        self.max_request_bytes = max(HELLO_MAX_FRAME_BYTES,
                                     min(max_frame_bytes, self.limits.request_frame_bytes(state.max_value_bytes)))
        self.handshake_timeout = handshake_timeout
        self.address = "unbound"
        self._token = None if token is None else token.encode()
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[PeerConnection] = set()
        self._pending: dict[PeerConnection, None] = {}  # in the handshake, oldest first
        self.peer_log = PeerLog(log)
        self._watches: dict[tuple[PeerConnection, int], str] = {}
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._expiry_deadline = 0.0

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen on ``host:port`` (0: any free port); returns the bound host and port.

        Raises:
            OSError: the address cannot be bound.
        """
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: PeerConnection(self), host, port, reuse_address=True)
        bound_port = self._server.sockets[0].getsockname()[1]
        self.address = Endpoint(host, bound_port).netloc
        self._schedule_expiry()
        log.info("elastic-store %s: serving store %s at revision %s",
                 self.address, self.state.store_id, self.state.revision)
        return host, bound_port

    def close(self) -> None:
        """Stop listening and drop every client (they see the connection close). Idempotent."""
        if self._server is not None:
            self._server.close()
        self.drop_connections()
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        self.peer_log.close()

    def drop_connections(self) -> None:
        """Abort every client connection; clients see the connection drop and reconnect."""
        for connection in list(self._connections):
            connection.abort()

    async def wait_closed(self) -> None:
        if self._server is not None:
            await self._server.wait_closed()

    # -- used by connections -----------------------------------------------------------------
    def token_accepted(self, token: object) -> bool:
        """Whether ``token`` matches the shared token (constant-time)."""
        if self._token is None:
            return True
        return isinstance(token, str) and hmac.compare_digest(token.encode("utf-8", "surrogatepass"), self._token)

    def hello(self) -> dict[str, Any]:
        state = self.state
        return {
            "v": PROTOCOL_VERSION,
            "store": state.store_id,
            "rev": state.revision,
            "crev": state.compact_revision,
            "max_frame": self.max_request_bytes,
            "max_value": state.max_value_bytes,
            "max_key": state.max_key_bytes,
        }

    def register(self, connection: "PeerConnection") -> bool:
        """Admit a new connection; False (after telling it why) when the server is full.

        A connection beyond ``max_pending_connections`` still in the handshake evicts the
        oldest such one, so strangers that connect and stay silent cannot lock clients out.
        """
        if len(self._connections) >= self.limits.max_connections:
            self._note_refusal(f"refused {connection.peer}: {len(self._connections)} connections "
                               f"is the limit (max_connections)")
            connection.refuse("busy", f"The store serves at most {self.limits.max_connections} connections "
                                      "at once; retry later, or raise its --max-connections.")
            return False
        if len(self._pending) >= self.limits.max_pending_connections:
            oldest = next(iter(self._pending))
            self._note_refusal(f"dropped {oldest.peer}, the oldest of {len(self._pending)} connections "
                               f"still in the handshake (max_pending_connections)")
            self._pending.pop(oldest, None)
            oldest.abort()
        self._connections.add(connection)
        self._pending[connection] = None
        return True

    def authenticated(self, connection: "PeerConnection") -> None:
        self._pending.pop(connection, None)

    def unregister(self, connection: "PeerConnection") -> None:
        self._connections.discard(connection)
        self._pending.pop(connection, None)
        if connection.watch_count:
            for key in [key for key in self._watches if key[0] is connection]:
                del self._watches[key]

    def _note_refusal(self, what: str) -> None:
        """Log refusals and evictions, rate-limited (a flood must not flood the log)."""
        self.peer_log.note("refusal", logging.WARNING, "elastic-store %s: %s", self.address, what)

    def handle(self, connection: "PeerConnection", frame: Frame) -> None:
        """Answer one authenticated request, then fan out the events it produced.

        Raises:
            ProtocolError: the frame has no request id or op (the connection must be dropped).
        """
        header = frame.header
        request_id, op = header.get("i"), header.get("op")
        if not isinstance(request_id, int) or isinstance(request_id, bool) or not isinstance(op, str):
            raise ProtocolError("A request frame lacks its integer id or its op.")
        try:
            if op == "watch":
                self._watch(connection, request_id, header)
                return
            if op == "unwatch":
                if self._watches.pop((connection, field(header, "w", int)), None) is not None:
                    connection.watch_count -= 1
                connection.send({"i": request_id})
                return
            reply = apply_request(self.state, op, header, frame.payload)
        except (BackendError, ValueError) as error:
            connection.send({"i": request_id, **error_to_wire(error)})
            return
        except Exception as error:  # a bug must cost one request, not the server
            log.exception("elastic-store %s: request %r from %s failed", self.address, op, connection.peer)
            connection.send({"i": request_id, "err": "internal", "msg": f"The store failed: {error!r}"})
            return
        response = reply.header
        response["i"] = request_id
        connection.send(response, reply.parts)
        if reply.events:
            self.fan_out(reply.events)
        if op in LEASE_OPS:
            self._schedule_expiry()

    def fan_out(self, events: Sequence[WatchEvent]) -> None:
        """Push ``events`` to every watch whose prefix matches."""
        if not events:
            return
        for (connection, watch_id), prefix in list(self._watches.items()):
            matching = [event for event in events if event.kv.key.startswith(prefix)]
            if matching:
                connection.push_events(watch_id, matching)

    # -- internals ---------------------------------------------------------------------------
    def _watch(self, connection: "PeerConnection", request_id: int, header: dict[str, Any]) -> None:
        prefix = field(header, "p", str)
        start = header.get("s")
        start = self.state.revision + 1 if start is None else field(header, "s", int)
        backlog = self.state.events_since(prefix, start)
        key = (connection, request_id)
        if key not in self._watches:
            if connection.watch_count >= self.limits.max_watches_per_connection:
                raise LimitExceededError(
                    f"This connection already holds {connection.watch_count} watches, the store's limit "
                    "(--max-watches-per-connection); cancel some, or open another connection."
                )
            connection.watch_count += 1
        self._watches[key] = prefix
        connection.send({"i": request_id, "s": start})
        if backlog:
            connection.push_events(request_id, backlog)

    def _schedule_expiry(self) -> None:
        deadline = self.state.next_expiry()
        if deadline is None or (self._expiry_timer is not None and self._expiry_deadline <= deadline):
            return
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
        delay = max(deadline - self.state.clock(), 0.0)
        self._expiry_deadline = deadline
        self._expiry_timer = asyncio.get_running_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        self._expiry_timer = None
        events = self.state.expire_due()
        if events:
            log.debug("elastic-store %s: leases expired, %d keys deleted", self.address, len(events))
            self.fan_out(events)
        self._schedule_expiry()
