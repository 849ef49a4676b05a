"""Parse endpoint strings such as ``host:port``, ``[::1]:2379``, ``https://etcd-0:2379,etcd-1:2379``
or (for etcd) ``unix:///run/etcd.sock``."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from backends.errors import EndpointError

_SCHEMES = ("http", "https")
UNIX = "unix"
"""The scheme of a unix socket endpoint; its ``host`` is the socket's absolute path, its port 0."""


@dataclass(frozen=True)
class Endpoint:
    """One server address. ``scheme`` is ``https`` when the endpoint asked for TLS, ``unix`` for
    a unix socket (``host`` is then the socket's path)."""

    host: str
    port: int
    scheme: str = "http"

    @property
    def netloc(self) -> str:
        """``host:port`` with IPv6 hosts bracketed; ``unix:/path`` for a unix socket (gRPC's target form)."""
        if self.scheme == UNIX:
            return f"{UNIX}:{self.host}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return self.netloc


def parse_endpoint(text: str, default_port: int, *, allow_unix: bool = False) -> Endpoint:
    """Parse one endpoint.

    Args:
        allow_unix: also accept ``unix:///absolute/path`` (or ``unix:/absolute/path``).

    Raises:
        EndpointError: the text is not ``[scheme://]host[:port]`` with a port in 1..65535 (or
            an allowed unix socket path).
    """
    original = _redact(text)
    text = text.strip()
    if text.lower().startswith(f"{UNIX}:"):
        return _unix_endpoint(text[len(UNIX) + 1:], original, allow_unix)
    if "@" in text:
        raise EndpointError(
            f"The endpoint {original!r} has user info (credentials) in it; give the user as "
            "--rdzv-conf user=NAME and the password as --rdzv-conf password_file=PATH instead."
        )
    scheme = "http"
    if "://" in text:
        scheme, _, text = text.partition("://")
        scheme = scheme.lower()
        if scheme not in _SCHEMES:
            raise EndpointError(
                f"The endpoint {original!r} has scheme {scheme!r}; use http:// or https:// or none."
            )
    text = text.rstrip("/")
    if not text:
        raise EndpointError(f"The endpoint {original!r} has no host; expected host:port, e.g. 127.0.0.1:2379.")
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise EndpointError(f"The endpoint {original!r} has an unclosed IPv6 bracket; expected [addr]:port.")
        port_text = rest[1:] if rest else ""
    elif text.count(":") > 1:
        raise EndpointError(f"The endpoint {original!r} looks like a bare IPv6 address; write it as [addr]:port.")
    else:
        host, _, port_text = text.partition(":")
    if not host or any(ch.isspace() or ch in "/?#@" for ch in host):
        raise EndpointError(f"The endpoint {original!r} has an invalid host; expected host:port, e.g. 127.0.0.1:2379.")
    if not port_text:
        return Endpoint(host, default_port, scheme)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise EndpointError(f"The endpoint {original!r} has port {port_text!r}; a port is a number from 1 to 65535.")
    return Endpoint(host, int(port_text), scheme)


def _unix_endpoint(path: str, original: str, allow_unix: bool) -> Endpoint:
    if not allow_unix:
        raise EndpointError(f"The endpoint {original!r} is a unix socket; only etcd endpoints may be, use host:port.")
    if path.startswith("//"):
        path = path[2:]
    if not path.startswith("/") or path.rstrip("/") == "" or any(ch in path for ch in "\0?#,"):
        raise EndpointError(
            f"The endpoint {original!r} needs an absolute socket path, e.g. unix:///run/etcd/etcd.sock."
        )
    return Endpoint(path, 0, UNIX)


def _redact(text: str) -> str:
    """``text`` with any user info replaced by ``***`` and cut to about 100 characters, for messages."""
    if "@" in text:
        scheme, sep, rest = text.strip().rpartition("://")
        text = f"{scheme}{sep}***@{rest.rpartition('@')[2]}"
    return text if len(text) <= 100 else f"{text[:100]}... ({len(text)} characters)"


def parse_endpoints(
    text: str | list[str] | tuple[str, ...], default_port: int, *, allow_unix: bool = False
) -> tuple[Endpoint, ...]:
    """Parse a comma-separated list (or a sequence) of endpoints; at least one is required.

    Raises:
        EndpointError: the list is empty or one entry is malformed.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    items = [item for item in (part.strip() for part in items) if item]
    if not items:
        raise EndpointError("No endpoint given; expected host:port[,host:port...], e.g. 127.0.0.1:2379.")
    return tuple(parse_endpoint(item, default_port, allow_unix=allow_unix) for item in items)


def is_loopback_only(host: str) -> bool:
    """Whether every address ``host`` names is a loopback address (an unresolvable name: False)."""
    if host in ("", "0.0.0.0", "::"):
        return False
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(addresses) and all(ipaddress.ip_address(address.split("%")[0]).is_loopback for address in addresses)
