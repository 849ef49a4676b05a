"""The TCP store server in a background thread: what the agent embeds and ``elastic-store`` runs.

:func:`start_server` starts a :class:`~backends.tcp.store_server.StoreServer` on its own asyncio
loop in a daemon thread and returns a :class:`StoreServerHandle` to stop it and inject faults.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time

from backends.endpoints import Endpoint
from backends.kvstate import (
    DEFAULT_HISTORY_BYTES,
    DEFAULT_HISTORY_LIMIT,
    DEFAULT_MAX_KEY_BYTES,
    DEFAULT_MAX_LEASES,
    DEFAULT_MAX_LIVE_BYTES,
    DEFAULT_MAX_VALUE_BYTES,
    KVState,
    StateLimits,
)
from backends.tcp.limits import StoreLimits
from backends.tcp.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
)
from backends.tcp.store_server import StoreServer

__all__ = ["StoreServerHandle", "start_server"]

log = logging.getLogger(__name__)


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

    def freeze(self, seconds: float, timeout: float = 5.0) -> None:
        """Block the server's loop for ``seconds`` (fault injection: an unresponsive server).

        Returns once the loop is blocked, so whatever a client sends after the call is read only
        after the thaw, behind anything else asked of the loop meanwhile (such as a stop).

        Raises:
            TimeoutError: the loop did not start the freeze within ``timeout`` seconds.
        """
        frozen = threading.Event()

        def block() -> None:
            frozen.set()
            time.sleep(seconds)

        self._loop.call_soon_threadsafe(block)
        if not frozen.wait(timeout):
            raise TimeoutError(f"elastic-store {self.endpoint}: the loop did not freeze within {timeout} s")

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
        state = KVState(limits=StateLimits(max_value_bytes=max_value_bytes, max_key_bytes=max_key_bytes,
                                           max_live_bytes=max_live_bytes, max_leases=max_leases,
                                           history_limit=history_limit, history_bytes=history_bytes))
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
