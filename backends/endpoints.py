"""Parse endpoint strings such as ``host:port``, ``[::1]:2379`` or ``https://etcd-0:2379,etcd-1:2379``."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from backends.errors import EndpointError

_SCHEMES = ("http", "https")


@dataclass(frozen=True)
class Endpoint:
    """One server address. ``scheme`` is ``https`` when the endpoint asked for TLS."""

    host: str
    port: int
    scheme: str = "http"

    @property
    def netloc(self) -> str:
        """``host:port`` with IPv6 hosts bracketed."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return self.netloc


def parse_endpoint(text: str, default_port: int) -> Endpoint:
    """Parse one endpoint.

    Raises:
        EndpointError: the text is not ``[scheme://]host[:port]`` with a port in 1..65535.
    """
    original = _redact(text)
    text = text.strip()
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


def _redact(text: str) -> str:
    """``text`` with any user info replaced by ``***`` and cut to about 100 characters, for messages."""
    if "@" in text:
        scheme, sep, rest = text.strip().rpartition("://")
        text = f"{scheme}{sep}***@{rest.rpartition('@')[2]}"
    return text if len(text) <= 100 else f"{text[:100]}... ({len(text)} characters)"


def parse_endpoints(text: str | list[str] | tuple[str, ...], default_port: int) -> tuple[Endpoint, ...]:
    """Parse a comma-separated list (or a sequence) of endpoints; at least one is required.

    Raises:
        EndpointError: the list is empty or one entry is malformed.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    items = [item for item in (part.strip() for part in items) if item]
    if not items:
        raise EndpointError("No endpoint given; expected host:port[,host:port...], e.g. 127.0.0.1:2379.")
    return tuple(parse_endpoint(item, default_port) for item in items)


def is_loopback_only(host: str) -> bool:
    """Whether every address ``host`` names is a loopback address (an unresolvable name: False)."""
    if host in ("", "0.0.0.0", "::"):
        return False
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(addresses) and all(ipaddress.ip_address(address.split("%")[0]).is_loopback for address in addresses)
