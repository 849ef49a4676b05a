"""The client's side of the TCP store handshake: send the hello, read the store's answer.

See :mod:`backends.tcp.protocol` for the exchange; the server's side is
:class:`backends.tcp.peer.PeerConnection`.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any

from backends.endpoints import Endpoint
from backends.errors import BackendAuthError, BackendConnectionError, BackendTimeoutError, ProtocolError
from backends.tcp.protocol import MAGIC, PROTOCOL_VERSION, FrameDecoder, encode_frame, error_from_wire

__all__ = ["Hello", "handshake"]

_RECV_BYTES = 64 * 1024


@dataclass(frozen=True)
class Hello:
    """What the server said about itself in the handshake."""

    store_id: str
    revision: int
    compact_revision: int
    max_frame_bytes: int
    max_value_bytes: int

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> "Hello":
        """Raises ProtocolError when a field is missing or malformed."""
        try:
            return cls(str(header["store"]), int(header["rev"]), int(header["crev"]),
                       int(header["max_frame"]), int(header["max_value"]))
        except (KeyError, TypeError, ValueError) as error:
            raise ProtocolError(f"The store's handshake answer is malformed ({error!r}).") from error


def handshake(sock: socket.socket, endpoint: Endpoint, token: str | None, max_frame_bytes: int,
              deadline: float) -> tuple[Hello, FrameDecoder]:
    """Send the hello and read the store's answer before ``deadline`` (monotonic).

    Returns what the store said and the frame decoder to read the connection with from then on.

    Raises:
        BackendConnectionError: the peer hung up, or the socket failed.
        BackendTimeoutError: the peer did not answer in time.
        BackendAuthError, ProtocolError: the store refused (from its error frame), or the peer
            is not an elastic-store.
    """
    hello = {"v": PROTOCOL_VERSION, "token": token, "max_frame": max_frame_bytes}
    try:
        sock.sendall(MAGIC + encode_frame(hello))
    except OSError as error:
        raise BackendConnectionError(f"Cannot send the handshake to {endpoint}: {error}.") from error
    received = b""
    while len(received) < len(MAGIC):
        received += _recv_before(sock, endpoint, deadline, got_any=bool(received))
        if not MAGIC.startswith(received[: len(MAGIC)]):
            raise ProtocolError(
                f"The peer at {endpoint} is not an elastic-store (it answered {received[:40]!r}); "
                "check the endpoint's host and port."
            )
    decoder = FrameDecoder(max_frame_bytes)
    frames = decoder.feed(received[len(MAGIC):])
    while not frames:
        frames = decoder.feed(_recv_before(sock, endpoint, deadline, got_any=True))
    header = frames[0].header
    if "err" in header:
        refused = error_from_wire(header)
        if isinstance(refused, BackendAuthError):  # the store's words, with where and which setting
            raise BackendAuthError(f"The elastic-store at {endpoint} rejected this node's token (wrong or missing); "
                                   "pass the store's token with --rdzv-conf token_file=FILE (the same file on every "
                                   "node)") from refused
        raise refused
    return Hello.from_header(header), decoder


def _recv_before(sock: socket.socket, endpoint: Endpoint, deadline: float, *, got_any: bool) -> bytes:
    remaining = deadline - time.monotonic()
    try:
        if remaining <= 0:
            raise TimeoutError
        sock.settimeout(remaining)
        data = sock.recv(_RECV_BYTES)
    except TimeoutError as error:
        raise BackendTimeoutError(
            f"The peer at {endpoint} did not complete the elastic-store handshake in time; "
            "is it an elastic-store, and is it overloaded?"
        ) from error
    except OSError as error:
        raise BackendConnectionError(
            f"The handshake with {endpoint} failed ({error.strerror or error}): it dropped the connection, so it "
            "is most likely not an elastic-store (an etcd port? then use --rdzv-backend=etcd), or it is shutting down."
        ) from error
    if not data:
        what = "in the middle of" if got_any else "before answering"
        raise BackendConnectionError(
            f"The peer at {endpoint} closed the connection {what} the handshake; "
            "it is shutting down, or it is not an elastic-store."
        )
    return data
