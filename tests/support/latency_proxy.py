"""A TCP forwarder that adds latency, for tests of a slow link to etcd (no tc/netem needed).

``LatencyProxy(("127.0.0.1", 2379), delay=1.0)`` listens on a free loopback port and forwards
every connection to the target, holding each chunk it reads for ``delay`` seconds before
writing it on, in both directions: a round trip through it costs ``2 * delay`` more, and
throughput is not limited (chunks read meanwhile are held in order, each for its own delay).
The client's TCP connect completes at once (it is local), so a connection's setup costs the
client one round trip less than a real slow link; everything after it (HTTP/2's greeting, TLS,
every RPC) pays the full latency. :meth:`LatencyProxy.set_delay` changes the delay for chunks
read from then on.

Bounded: at most ``max_connections`` connections at once (more are closed at once), and at
most ``max_held_bytes`` held per direction of a connection (reading pauses until the writer
catches up). It runs an asyncio loop on one daemon thread; :meth:`LatencyProxy.stop` (or the
``with`` block) closes every connection and ends the thread. Used by the chaos suite
(``tests/chaos/test_store_faults.py``) and reusable for any TCP service.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

log = logging.getLogger(__name__)

CHUNK = 64 * 1024


class LatencyProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target`` with ``delay`` seconds each way (see the module docstring).

    Raises (from :meth:`start`):
        OSError: it could not listen.
    """

    def __init__(self, target: tuple[str, int], delay: float, *, host: str = "127.0.0.1", port: int = 0,
                 max_connections: int = 64, max_held_bytes: int = 8 * 1024 * 1024) -> None:
        if delay < 0:
            raise ValueError(f"The delay ({delay}) must not be negative.")
        self.target = target
        self.delay = delay
        self.host = host
        self.port = port
        self.max_connections = max_connections
        self.max_held_chunks = max(1, max_held_bytes // CHUNK)
        self.connections = 0
        self.accepted = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="latency-proxy", daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def address(self) -> str:
        """``host:port`` clients connect to."""
        return f"{self.host}:{self.port}"

    def set_delay(self, delay: float) -> None:
        self.delay = delay

    def start(self) -> "LatencyProxy":
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, self.host, self.port), self._loop).result(timeout=10)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("Latency proxy %s -> %s:%d, %.3fs each way", self.address, *self.target, self.delay)
        return self

    def stop(self) -> None:
        """Close the listener and every connection, end the thread; idempotent."""
        if not self._thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> "LatencyProxy":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- on the loop's thread ----------------------------------------------------------------
    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if self.connections >= self.max_connections:
            client_writer.close()
            return
        self._tasks.add(task)  # type: ignore[arg-type]
        self.connections += 1
        self.accepted += 1
        upstream_writer = None
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
            await asyncio.gather(self._pipe(client_reader, upstream_writer),
                                 self._pipe(upstream_reader, client_writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass  # stopped: end quietly (asyncio's stream callback reports a cancelled task as an error)
        finally:
            self.connections -= 1
            self._tasks.discard(task)  # type: ignore[arg-type]
            for writer in (client_writer, upstream_writer):
                if writer is not None:
                    writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy ``reader`` to ``writer``, each chunk ``delay`` seconds after it was read."""
        loop = asyncio.get_running_loop()
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(self.max_held_chunks)

        async def read() -> None:
            try:
                while chunk := await reader.read(CHUNK):
                    await held.put((loop.time() + self.delay, chunk))
            finally:
                await held.put((loop.time() + self.delay, b""))

        async def write() -> None:
            while True:
                due, chunk = await held.get()
                await asyncio.sleep(max(due - loop.time(), 0.0))
                if not chunk:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(chunk)
                await writer.drain()

        reading = asyncio.ensure_future(read())
        try:
            await write()
        finally:
            reading.cancel()
