"""Connect to a rendezvous backend from its parsed spec (:mod:`elastic.rendezvous.backend_spec`).

``etcd`` / ``etcd-v3``: etcd v3 at the spec's endpoints (a cluster, with failover).
``tcp``: a running built-in store (``elastic-store``, or another node's embedded one).
``c10d``: the built-in store, hosted by the node whose address matches the endpoint (or
         ``is_host=1``), as torchrun users expect; the others connect to it. The host binds
         the endpoint's address when that is one of this machine's, else (``is_host=1`` with
         another address, e.g. behind NAT) every interface, ``0.0.0.0``; off loopback it needs
         ``token_file=`` (every node the same) or the explicit ``insecure_open_store=1``.
``static``: fixed ranks from ``--node-rank``, no elasticity, no backend.

A node that connects to a built-in store may start before it listens: given a
:class:`~elastic.rendezvous.store_wait.StoreWait` it keeps trying until the join timeout
(:mod:`elastic.rendezvous.store_wait`). A c10d host whose port another process holds first
checks with one connection that the holder is a store (:mod:`elastic.rendezvous.taken_port`).

Nothing here parses a string: the spec carries typed values. Optional dependencies (the etcd
client) are imported only when their backend is chosen.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
from dataclasses import dataclass
from typing import Callable

from backends.api import KVBackend
from backends.endpoints import is_loopback_only
from backends.errors import (
    BackendConnectionError, BackendError, BackendPermissionError, BackendTimeoutError, EndpointError, ProtocolError,
)
from elastic.rendezvous.backend_spec import (
    OPEN_STORE_OPTION, BackendSpec, EtcdSpec, Hosting, StandaloneSpec, StaticSpec, StoreBackedSpec, StoreSpec,
)
from elastic.rendezvous.errors import RendezvousConfigError, RendezvousConnectionError
from elastic.rendezvous.latency import Timing, describe, fit_to_round_trip, raised
from elastic.rendezvous.ports import master_port_listener
from elastic.rendezvous.records import RendezvousKeys
from elastic.rendezvous.settings import RendezvousSettings
from elastic.rendezvous.store_wait import StoreWait, wait_for_store
from elastic.rendezvous.taken_port import not_a_store, taken_port_message

log = logging.getLogger(__name__)


@dataclass
class OpenedBackend:
    """A connected backend and what to release with it (an embedded server, for c10d hosts).

    ``round_trip``: seconds of a read measured at connect (etcd; 0.0: not measured);
    ``raised``: the timeouts raised to fit it (see :mod:`elastic.rendezvous.latency`);
    ``endpoint``: where, for messages.
    """

    backend: KVBackend
    release: Callable[[], None]
    hosted_endpoint: str | None = None
    round_trip: float = 0.0
    raised: tuple[str, ...] = ()
    endpoint: str = ""


def open_backend(spec: StoreBackedSpec, wait: StoreWait | None = None, *,
                 keys: RendezvousKeys | None = None) -> OpenedBackend:
    """Connect to the backend ``spec`` names (hosting the store first when this node is a c10d host).

    ``wait``: how long to keep trying a built-in store that is not up yet (None: fail at once;
    etcd is always tried once). ``keys``: the run whose keys etcd's connection check reads (a
    least-privilege etcd user may read nothing else; None: the default namespace's prefix).

    Raises:
        RendezvousConfigError: a certificate file or secret file cannot be read, or the backend
            refuses a limit; a c10d host would serve its store open off loopback.
        RendezvousConnectionError: the backend could not be reached (within ``wait``) or refused
            our credentials.
    """
    try:
        if isinstance(spec, EtcdSpec):
            return _open_etcd(spec, keys)
        return _open_store(spec, wait)
    except EndpointError as error:
        raise RendezvousConfigError(f"--rdzv-endpoint / --rdzv-conf for backend {spec.name!r}: {error}") from error
    except BackendError as error:
        raise RendezvousConnectionError(
            f"Cannot use the {spec.name} backend at {spec.endpoint_text!r}: {error}"
        ) from error


DEFAULT_PREFIX = f"{RendezvousSettings.namespace}/"
"""Where etcd's connection check reads when no run is named: the default namespace's prefix."""


def _open_etcd(spec: EtcdSpec, keys: RendezvousKeys | None) -> OpenedBackend:
    try:
        from backends.etcd import EtcdBackend, EtcdConfig
        from backends.etcd.diagnose import second_look
        from backends.etcd.translate import RequestNotSent
    except ImportError as error:
        raise RendezvousConfigError(
            f"The etcd backend's client is missing ({error}); reinstall etcd-elastic: it depends on "
            "python3-etcd3, grpcio and protobuf."
        ) from error
    certificate, credentials = spec.client_certificate, spec.credentials
    config = EtcdConfig(
        endpoints=spec.endpoints,
        ca_cert=spec.ca_cert,
        client_cert=certificate.cert if certificate else None,
        client_key=certificate.key if certificate else None,
        user=credentials.user if credentials else None,
        password=credentials.password.read() if credentials else None,
        dial_timeout=spec.timeouts.dial,
        request_timeout=spec.timeouts.request,
        max_response_bytes=spec.max_response_bytes,
    )
    backend = EtcdBackend(config)
    # Fail fast on a wrong endpoint or credentials, before any node state is written, and fit
    # the timeouts to the link (elastic.rendezvous.latency): the probe gets dial + request time.
    # It reads a key of the run itself: a least-privilege user may read nothing else.
    try:
        probe = keys.root if keys is not None else DEFAULT_PREFIX
        round_trip = backend.round_trip(budget=config.dial_timeout + config.request_timeout, key=probe)
    except RequestNotSent as error:
        backend.close()
        raise second_look(error, config) or error
    except BackendPermissionError as error:
        backend.close()
        grant = keys.namespace_prefix if keys is not None else DEFAULT_PREFIX
        raise BackendPermissionError(no_access(config.user, probe, grant)) from error
    except BaseException:
        backend.close()
        raise
    given = Timing(config.dial_timeout, config.request_timeout, 0.0)
    fitted = fit_to_round_trip(round_trip, given)
    changes = raised(given, fitted)
    if changes:
        backend.close()  # its connections were made with the old timeouts: reconnect with the new
        backend = EtcdBackend(dataclasses.replace(config, dial_timeout=fitted.dial, request_timeout=fitted.request))
    return OpenedBackend(backend, backend.close, round_trip=round_trip, raised=changes, endpoint=config.endpoint_list)


def no_access(user: str | None, probe: str, grant: str) -> str:
    """The line for an etcd user whose role may not read the run's keys (under ``probe``): grant
    it readwrite on ``grant``, the namespace prefix. Pure."""
    return (f"etcd user {user!r} may not read the run's keys under {probe!r} (etcd: permission denied); grant its "
            f"role readwrite on the namespace prefix: etcdctl role grant-permission --prefix=true ROLE readwrite "
            f"{grant} (etcdctl user get {user} names ROLE; see docs/security.md).")


def _open_store(spec: StoreSpec, wait: StoreWait | None) -> OpenedBackend:
    from backends.tcp.client import TcpStoreBackend, TcpStoreConfig

    address = spec.endpoint
    token = spec.token.read() if spec.token else None
    release_server: Callable[[], None] = lambda: None
    hosted = None
    host_failed = False
    if _should_host(spec):
        from backends.tcp.server import start_server

        bind_host = address.host if _is_local(address.host) else "0.0.0.0"
        check_open_hosting(bind_host, address.port, token, spec.insecure_open_store)
        try:
            server = start_server(bind_host, address.port, token)
            release_server, hosted = server.stop, server.endpoint
            log.info("Hosting the built-in rendezvous store on %s", hosted)
        except OSError as error:
            host_failed = True
            log.info("Not hosting the store on %s (%s); connecting to the existing one", address.netloc, error)
    config = TcpStoreConfig(address.netloc, token=token, connect_timeout=spec.timeouts.dial,
                            request_timeout=spec.timeouts.request)
    backend = TcpStoreBackend(config)

    def connect() -> None:
        backend.get("/")

    try:
        if wait is None or hosted is not None:
            connect()
        else:  # nodes start in any order: the store may not listen yet
            if host_failed:
                _probe_holder(connect, spec, wait)
            wait_for_store(connect, store_subject(spec, host_failed), store_fix(spec), wait)
    except (BackendError, RendezvousConnectionError):
        backend.close()
        release_server()
        raise

    def release() -> None:
        backend.close()
        release_server()

    return OpenedBackend(backend, release, hosted)


def _probe_holder(connect: Callable[[], None], spec: StoreSpec, wait: StoreWait) -> None:
    """One connection to whatever holds the port this c10d node could not host on; returns when
    it is a store or nothing listens any more (then the usual wait follows).

    Raises:
        RendezvousConnectionError: what holds the port is not an elastic-store (one line,
            :mod:`elastic.rendezvous.taken_port`).
        BackendError: it is a store that refuses us (auth): as it is.
    """
    try:
        connect()
    except (BackendConnectionError, BackendTimeoutError, ProtocolError) as error:
        reason = not_a_store(error, spec.timeouts.dial)
        if reason is not None:
            raise RendezvousConnectionError(
                taken_port_message(wait.run_id, wait.node, spec.endpoint.netloc, reason)) from error


def store_subject(spec: StoreSpec, host_failed: bool = False) -> str:
    """What a node that connects to the built-in store waits for, e.g. ``the c10d store host at
    h:29400 (is_host=0)``; ``host_failed``: this node tried to host it and the port was taken."""
    where = spec.endpoint.netloc
    if spec.name != "c10d":
        return f"the elastic-store at {where}"
    if host_failed:
        why = "its port is taken on this node: another process hosts it"
    elif spec.hosting is Hosting.CONNECT:
        why = "is_host=0"
    else:
        why = f"{spec.endpoint.host} is not this node's address"
    return f"the c10d store host at {where} ({why})"


def store_fix(spec: StoreSpec) -> str:
    """What to do when the built-in store at ``spec``'s endpoint never comes up."""
    host, port = spec.endpoint.host, spec.endpoint.port
    if spec.name != "c10d":
        return f"Start it (elastic-store --host {host} --port {port}) or fix --rdzv-endpoint"
    return (f"Start the node that hosts it (the one whose address is {host}, or with --rdzv-conf is_host=1) "
            "or fix --rdzv-endpoint")


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


def _should_host(spec: StoreSpec) -> bool:
    if spec.hosting is Hosting.BY_ADDRESS:
        return _is_local(spec.endpoint.host)
    return spec.hosting is Hosting.HOST


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


def create_handler(
    spec: BackendSpec,
    settings: RendezvousSettings,
    node_addr: str,
    *,
    local_world_size: int = 1,
    role: str = "default",
):
    """Build the handler for the backend ``spec`` names; the handler owns what it opened.

    ``local_world_size`` and ``role`` describe this node's workers (published with its joins).
    A :class:`StandaloneSpec` must be hosted first (``StandaloneSpec.hosted_at``).

    Raises:
        RendezvousConfigError: a file the spec names cannot be read, an unhosted standalone spec,
            or (static, node rank 0) a master port this node cannot listen on.
        RendezvousConnectionError: the backend could not be reached.
    """
    from elastic.rendezvous.handler import NodeSpec, RendezvousHandler

    if isinstance(spec, StaticSpec):
        from elastic.rendezvous.static import StaticRendezvousHandler, master_port_problem

        listener = None
        if spec.node_rank == 0:  # its agent hosts the workers' store there; elsewhere it cannot be known
            try:
                listener = master_port_listener(spec.master.port)
            except OSError as error:
                raise RendezvousConfigError(master_port_problem(spec.master.port, error, settings.max_nodes)) from None
        return StaticRendezvousHandler(settings.run_id, settings.max_nodes, spec.node_rank,
                                       spec.master.host, spec.master.port, listener)
    if isinstance(spec, StandaloneSpec):
        raise RendezvousConfigError("A --standalone store must be hosted before a handler can use it.")
    opened = open_backend(spec, StoreWait(settings.run_id, node_addr, settings.join_timeout),
                          keys=RendezvousKeys(settings.namespace, settings.run_id))
    settings = _fit_lease(settings, opened, node_addr)
    node = NodeSpec(node_addr, local_world_size=local_world_size, role=role)
    return RendezvousHandler(settings, opened.backend, node, release=opened.release)


def _fit_lease(settings: RendezvousSettings, opened: OpenedBackend, node_addr: str) -> RendezvousSettings:
    """``settings`` with the lease TTL fitted to the measured round trip; one warning line for
    every timeout raised (see :mod:`elastic.rendezvous.latency`)."""
    given = Timing(0.0, 0.0, settings.lease_ttl)
    fitted = fit_to_round_trip(opened.round_trip, given)
    changes = opened.raised + raised(given, fitted)
    if changes:
        log.warning("Rendezvous %s: node %s: %s", settings.run_id, node_addr,
                    describe(opened.round_trip, changes, opened.endpoint))
    return dataclasses.replace(settings, lease_ttl=fitted.lease_ttl)
