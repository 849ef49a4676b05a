"""Rendezvous backends by name, as ``--rdzv-backend`` spells them.

``etcd`` / ``etcd-v3``: etcd v3 at ``--rdzv-endpoint`` (comma-separated for a cluster).
``tcp``: a running built-in store (``elastic-store``, or another node's embedded one).
``c10d``: the built-in store, hosted by the node whose address matches the endpoint (or
         ``is_host=1``), as torchrun users expect; the others connect to it. The host binds
         the endpoint's address; off loopback it needs ``token_file=`` (every node the same)
         or the explicit ``insecure_open_store=1``.
``static``: fixed ranks from ``--node-rank``, no elasticity, no backend.

Optional dependencies (the etcd client) are imported only when their backend is chosen.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from backends.api import KVBackend
from backends.endpoints import is_loopback_only, parse_endpoint
from backends.errors import BackendError, EndpointError
from elastic.rendezvous.errors import RendezvousConfigError, RendezvousConnectionError
from elastic.rendezvous.settings import RendezvousSettings

log = logging.getLogger(__name__)

ETCD_DEFAULT_PORT = 2379
STORE_DEFAULT_PORT = 29400

BACKEND_NAMES = ("etcd", "etcd-v3", "tcp", "c10d", "static")

OPEN_STORE_OPTION = "insecure_open_store"
"""``--rdzv-conf`` option that lets a c10d host serve its store off loopback without a token."""


@dataclass
class OpenedBackend:
    """A connected backend and what to release with it (an embedded server, for c10d hosts)."""

    backend: KVBackend
    release: Callable[[], None]
    hosted_endpoint: str | None = None


def open_backend(name: str, endpoint: str, options: Mapping[str, str]) -> OpenedBackend:
    """Connect to the backend ``name`` at ``endpoint``.

    Raises:
        RendezvousConfigError: unknown backend, malformed endpoint or option.
        RendezvousConnectionError: the backend could not be reached or refused our credentials.
    """
    try:
        if name in ("etcd", "etcd-v3"):
            return _open_etcd(endpoint, options)
        if name in ("tcp", "c10d"):
            return _open_store(endpoint, options, may_host=(name == "c10d"))
    except EndpointError as error:
        raise RendezvousConfigError(f"--rdzv-endpoint / --rdzv-conf for backend {name!r}: {error}") from error
    except BackendError as error:
        raise RendezvousConnectionError(f"Cannot use the {name} backend at {endpoint!r}: {error}") from error
    raise RendezvousConfigError(
        f"Unknown rendezvous backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}."
    )


def _open_etcd(endpoint: str, options: Mapping[str, str]) -> OpenedBackend:
    _check_removed_transport(options)
    try:
        from backends.etcd import EtcdBackend, EtcdConfig
    except ImportError as error:
        raise RendezvousConfigError(
            f"The etcd backend's client is missing ({error}); reinstall etcd-elastic: it depends on "
            "python3-etcd3, grpcio and protobuf."
        ) from error
    endpoints = endpoint
    if options.get("protocol", "").lower() == "https" and "://" not in endpoint:
        endpoints = ",".join(f"https://{item.strip()}" for item in endpoint.split(","))
    config = EtcdConfig(
        endpoints=endpoints,
        ca_cert=options.get("cacert"),
        client_cert=options.get("cert"),
        client_key=options.get("key"),
        user=options.get("user"),
        password=_secret(options, "password"),
        **_timeouts(options),
        **_response_limit(options),
    )
    backend = EtcdBackend(config)
    backend.get("/")  # fail fast on a wrong endpoint or credentials, before any node state is written
    return OpenedBackend(backend, backend.close)


def _open_store(endpoint: str, options: Mapping[str, str], may_host: bool) -> OpenedBackend:
    from backends.tcp.client import TcpStoreBackend, TcpStoreConfig

    address = parse_endpoint(endpoint, STORE_DEFAULT_PORT)
    token = _secret(options, "token")
    release_server: Callable[[], None] = lambda: None
    hosted = None
    if may_host and _should_host(address.host, options):
        from backends.tcp.server import start_server

        bind_host = address.host if _is_local(address.host) else "0.0.0.0"
        check_open_hosting(bind_host, address.port, token, _flag(options, OPEN_STORE_OPTION))
        try:
            server = start_server(bind_host, address.port, token)
            release_server, hosted = server.stop, server.endpoint
            log.info("Hosting the built-in rendezvous store on %s", hosted)
        except OSError as error:
            log.info("Not hosting the store on %s (%s); connecting to the existing one", address.netloc, error)
    timeouts = _timeouts(options)
    config = TcpStoreConfig(
        address.netloc, token=token,
        connect_timeout=timeouts.get("dial_timeout", 5.0),
        request_timeout=timeouts.get("request_timeout", 10.0),
    )
    try:
        backend = TcpStoreBackend(config)
        backend.get("/")
    except BackendError:
        release_server()
        raise

    def release() -> None:
        backend.close()
        release_server()

    return OpenedBackend(backend, release, hosted)


def check_open_hosting(bind_host: str, port: int, token: str | None, allow_open: bool) -> None:
    """Refuse to serve the store without a token on an address other machines can reach.

    Without a token, anyone who can reach the port can read and rewrite the members and the
    master address, or close the rendezvous. torchrun's c10d store is that open; we host it
    so only when asked to explicitly.

    Raises:
        RendezvousConfigError: ``bind_host`` is not loopback-only, ``token`` is None and
            ``allow_open`` is false; the message names both ways out.
    """
    if token is not None or allow_open or is_loopback_only(bind_host):
        return
    raise RendezvousConfigError(
        f"Refusing to host the c10d rendezvous store on {bind_host}:{port} without a token: anyone who can "
        "reach it could rewrite the rendezvous. Put the same secret in a file on every node and pass "
        f"--rdzv-conf token_file=PATH, or pass --rdzv-conf {OPEN_STORE_OPTION}=1 to host it open as torchrun does."
    )


def _should_host(host: str, options: Mapping[str, str]) -> bool:
    if options.get("is_host") is not None:
        return _flag(options, "is_host")
    return _is_local(host)


def _flag(options: Mapping[str, str], name: str) -> bool:
    return options.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _is_local(host: str) -> bool:
    """Whether ``host`` names this machine (loopback, its hostname, or one of its addresses)."""
    if host in ("localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        target = {info[4][0] for info in socket.getaddrinfo(host, None)}
        mine = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        return False
    return bool(target & (mine | {"127.0.0.1", "::1"}))


def _check_removed_transport(options: Mapping[str, str]) -> None:
    """``etcd_transport`` chose between grpcio and a built-in HTTP/2 client, which is gone.

    ``grpcio`` is what the client uses, so it stays accepted; anything else gets one line.
    """
    transport = options.get("etcd_transport")
    if transport is not None and transport.strip().lower() != "grpcio":
        raise RendezvousConfigError(
            f"--rdzv-conf etcd_transport={transport} was removed: the etcd client always uses grpcio; "
            "drop etcd_transport from --rdzv-conf."
        )


def _response_limit(options: Mapping[str, str]) -> dict[str, int]:
    """``max_response_bytes`` as an int (EtcdConfig checks its range); absent: the default."""
    text = options.get("max_response_bytes")
    if text is None:
        return {}
    try:
        return {"max_response_bytes": int(text)}
    except ValueError:
        raise RendezvousConfigError(f"The rendezvous option max_response_bytes={text!r} must be bytes.") from None


def _timeouts(options: Mapping[str, str]) -> dict[str, float]:
    found: dict[str, float] = {}
    for key, target in (("dial_timeout", "dial_timeout"), ("request_timeout", "request_timeout"),
                        ("read_timeout", "request_timeout")):
        if key in options:
            try:
                value = float(options[key])
            except ValueError:
                raise RendezvousConfigError(f"The rendezvous option {key}={options[key]!r} must be seconds.") from None
            if value <= 0:
                raise RendezvousConfigError(f"The rendezvous option {key}={options[key]!r} must be positive.")
            found[target] = value
    return found


def _secret(options: Mapping[str, str], name: str) -> str | None:
    """``name`` from options, or read from ``<name>_file``."""
    if name in options:
        return options[name]
    path = options.get(f"{name}_file")
    if path is None:
        return None
    try:
        return Path(path).read_text().strip()
    except OSError as error:
        raise RendezvousConfigError(f"Cannot read {name}_file {path!r}: {error.strerror}.") from error


def create_handler(
    backend_name: str,
    endpoint: str,
    settings: RendezvousSettings,
    node_addr: str,
    *,
    node_rank: int | None = None,
    local_world_size: int = 1,
    role: str = "default",
):
    """Build the handler for ``--rdzv-backend backend_name``; the handler owns what it opened.

    ``local_world_size`` and ``role`` describe this node's workers (published with its joins).

    Raises:
        RendezvousConfigError: unknown backend, malformed endpoint or option.
        RendezvousConnectionError: the backend could not be reached.
    """
    from elastic.rendezvous.handler import RendezvousHandler

    if backend_name == "static":
        from elastic.rendezvous.static import StaticRendezvousHandler

        if node_rank is None:
            raise RendezvousConfigError("The static rendezvous backend needs --node-rank.")
        master = parse_endpoint(endpoint, 29500) if endpoint else None
        return StaticRendezvousHandler(settings.run_id, settings.max_nodes, node_rank,
                                       master.host if master else "127.0.0.1", master.port if master else 29500)
    opened = open_backend(backend_name, endpoint, settings.backend_options)
    return RendezvousHandler(settings, opened.backend, node_addr, release=opened.release,
                             local_world_size=local_world_size, role=role)

