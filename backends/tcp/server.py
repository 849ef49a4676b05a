"""The TCP store server: one :class:`~backends.kvstate.KVState` served over asyncio.

:class:`StoreServer` runs on an asyncio loop you own; :func:`start_server` runs one in a
background thread and returns a :class:`StoreServerHandle` (what the agent embeds and what
``elastic-store`` runs). The server:

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
import concurrent.futures
import hmac
import logging
import threading
import time
from typing import Any, Sequence, cast

from backends.api import WatchEvent
from backends.endpoints import Endpoint
from backends.errors import BackendError, LimitExceededError, ProtocolError
from backends.kvstate import (
    DEFAULT_HISTORY_BYTES,
    DEFAULT_HISTORY_LIMIT,
    DEFAULT_MAX_KEY_BYTES,
    DEFAULT_MAX_LEASES,
    DEFAULT_MAX_LIVE_BYTES,
    DEFAULT_MAX_VALUE_BYTES,
    KVState,
)
from backends.tcp.limits import PRE_AUTH_FRAME_BYTES, StoreLimits
from backends.tcp.ops import LEASE_OPS, apply_request, field
from backends.tcp.peerlog import PeerLog
from backends.tcp.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
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

__all__ = ["StoreServer", "StoreServerHandle", "start_server"]

log = logging.getLogger(__name__)

HELLO_MAX_FRAME_BYTES = 64 * 1024
"""The smallest frame limit a server or client may set."""

_READ_BUFFER_BYTES = 64 * 1024
_PRE_AUTH_READ_BUFFER_BYTES = 4 * 1024


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
        self._connections: set[_StoreConnection] = set()
        self._pending: dict[_StoreConnection, None] = {}  # in the handshake, oldest first
        self.peer_log = PeerLog(log)
        self._watches: dict[tuple[_StoreConnection, int], str] = {}
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._expiry_deadline = 0.0

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen on ``host:port`` (0: any free port); returns the bound host and port.

        Raises:
            OSError: the address cannot be bound.
        """
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _StoreConnection(self), host, port, reuse_address=True)
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

    def register(self, connection: "_StoreConnection") -> bool:
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

    def authenticated(self, connection: "_StoreConnection") -> None:
        self._pending.pop(connection, None)

    def unregister(self, connection: "_StoreConnection") -> None:
        self._connections.discard(connection)
        self._pending.pop(connection, None)
        if connection.watch_count:
            for key in [key for key in self._watches if key[0] is connection]:
                del self._watches[key]

    def _note_refusal(self, what: str) -> None:
        """Log refusals and evictions, rate-limited (a flood must not flood the log)."""
        self.peer_log.note("refusal", logging.WARNING, "elastic-store %s: %s", self.address, what)

    def handle(self, connection: "_StoreConnection", frame: Frame) -> None:
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
    def _watch(self, connection: "_StoreConnection", request_id: int, header: dict[str, Any]) -> None:
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


class _StoreConnection(asyncio.BufferedProtocol):
    """One client: the handshake, then frames handed to the server in order.

    A buffered protocol, so each read lands in one reused buffer instead of a fresh 256 KiB
    allocation (which costs mmap/munmap system calls per request).
    """

    def __init__(self, server: StoreServer) -> None:
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


class StoreServerHandle:
    """A :class:`StoreServer` running on its own loop in a daemon thread; see :func:`start_server`."""

    def __init__(self, server: StoreServer, loop: asyncio.AbstractEventLoop, thread: threading.Thread,
                 host: str, port: int) -> None:
        self.server = server
        self.host = host
        self.port = port
        self._loop = loop
        self._thread = thread
        self._stop_lock = threading.Lock()
        self._stopped = False

    @property
    def endpoint(self) -> str:
        """``host:port`` to hand to clients."""
        return Endpoint(self.host, self.port).netloc

    @property
    def state(self) -> KVState:
        return self.server.state

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and drop every client; returns once the port is released. Idempotent."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        if not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._shut_down)
            except RuntimeError:  # the loop closed in the meantime
                pass
        self._thread.join(timeout)

    def drop_connections(self, timeout: float = 5.0) -> None:
        """Abort every client connection but keep serving (fault injection for tests and drills)."""
        done = concurrent.futures.Future()  # type: concurrent.futures.Future[None]

        def drop() -> None:
            self.server.drop_connections()
            done.set_result(None)

        self._loop.call_soon_threadsafe(drop)
        done.result(timeout)

    def freeze(self, seconds: float) -> None:
        """Block the server's loop for ``seconds`` (fault injection: an unresponsive server)."""
        self._loop.call_soon_threadsafe(time.sleep, seconds)

    def _shut_down(self) -> None:
        self.server.close()
        self._loop.stop()

    def __enter__(self) -> "StoreServerHandle":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_server(
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    *,
    state: KVState | None = None,
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    history_limit: int = DEFAULT_HISTORY_LIMIT,
    history_bytes: int = DEFAULT_HISTORY_BYTES,
    max_key_bytes: int = DEFAULT_MAX_KEY_BYTES,
    max_live_bytes: int = DEFAULT_MAX_LIVE_BYTES,
    max_leases: int = DEFAULT_MAX_LEASES,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    handshake_timeout: float = 10.0,
    limits: StoreLimits | None = None,
) -> StoreServerHandle:
    """Start a store server in a background thread; returns once it listens.

    Pass ``state`` to serve existing data (e.g. to restart a server without losing it);
    otherwise a fresh :class:`KVState` with ``max_value_bytes``, ``max_key_bytes``,
    ``max_live_bytes``, ``max_leases``, ``history_limit`` and ``history_bytes``. ``limits`` bounds what peers can make it hold.

    Raises:
        OSError: the address cannot be bound (e.g. the port is taken).
        ValueError: a limit is invalid.
    """
    if state is None:
        state = KVState(max_value_bytes=max_value_bytes, history_limit=history_limit, history_bytes=history_bytes,
                        max_key_bytes=max_key_bytes, max_live_bytes=max_live_bytes, max_leases=max_leases)
    server = StoreServer(state, token=token, max_frame_bytes=max_frame_bytes, handshake_timeout=handshake_timeout,
                         limits=limits)
    loop = asyncio.new_event_loop()
    started: concurrent.futures.Future[tuple[str, int]] = concurrent.futures.Future()
    thread = threading.Thread(target=_serve, args=(loop, server, host, port, started),
                              name=f"elastic-store-{host}:{port}", daemon=True)
    thread.start()
    bound_host, bound_port = started.result()
    return StoreServerHandle(server, loop, thread, bound_host, bound_port)


def _serve(loop: asyncio.AbstractEventLoop, server: StoreServer, host: str, port: int,
           started: "concurrent.futures.Future[tuple[str, int]]") -> None:
    asyncio.set_event_loop(loop)
    try:
        started.set_result(loop.run_until_complete(server.start(host, port)))
    except BaseException as error:  # handed to the starting thread, which raises it
        started.set_exception(error)
        loop.close()
        return
    try:
        loop.run_forever()
        loop.run_until_complete(server.wait_closed())
        loop.run_until_complete(asyncio.sleep(0))  # let aborted transports report connection_lost
    finally:
        loop.close()
        log.info("elastic-store %s: stopped", server.address)
