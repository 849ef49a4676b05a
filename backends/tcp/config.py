"""How to reach a TCP store: the client's settings, validated when made."""

from __future__ import annotations

from dataclasses import dataclass, field

from backends.endpoints import Endpoint, parse_endpoint
from backends.errors import EndpointError
from backends.tcp.protocol import DEFAULT_MAX_FRAME_BYTES, DEFAULT_PORT

__all__ = ["TcpStoreConfig"]


@dataclass(frozen=True)
class TcpStoreConfig:
    """How to reach a TCP store.

    Attributes:
        endpoint: ``host:port`` (port defaults to 29400).
        token: the store's shared token, or None for a store without one.
        connect_timeout: seconds to connect and complete the handshake.
        request_timeout: seconds to wait for one response.
        watch_resume_timeout: seconds between two warnings that lost watches still wait for the
            store (they keep resuming until it answers, the watch is cancelled or the client closed).
        max_frame_bytes: largest frame the client accepts.

    Raises:
        EndpointError: the endpoint is malformed or asks for TLS.
        ValueError: a timeout or limit is not positive.
    """

    endpoint: str
    token: str | None = field(default=None, repr=False)
    connect_timeout: float = 5.0
    request_timeout: float = 10.0
    watch_resume_timeout: float = 30.0
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    address: Endpoint = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("connect_timeout", "request_timeout", "watch_resume_timeout", "max_frame_bytes"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"The TCP store's {name} ({value}) must be positive.")
        address = parse_endpoint(self.endpoint, DEFAULT_PORT)
        if address.scheme != "http":
            raise EndpointError(
                f"The TCP store endpoint {self.endpoint!r} asks for TLS, which the store lacks; use host:port."
            )
        object.__setattr__(self, "address", address)
