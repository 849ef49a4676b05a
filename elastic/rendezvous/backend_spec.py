"""What ``--rdzv-backend``, ``--rdzv-endpoint`` and the connection keys of ``--rdzv-conf`` mean, parsed once.

One frozen spec per kind of backend: :class:`EtcdSpec` (``etcd``/``etcd-v3``), :class:`StoreSpec`
(the built-in TCP store: ``tcp``, ``c10d``), :class:`StaticSpec` (``static``) and
:class:`StandaloneSpec` (``--standalone``: a store the runner hosts, which becomes a
:class:`StoreSpec` once it listens). The CLI and the torchrun plugin build them; the registry
connects from them without reading a string again.

A password or token is a :class:`Secret` or a :class:`SecretFile`
(:mod:`elastic.rendezvous.secret_sources`, which also keeps inline secrets out of the
environment the agent hands down).

Raises (every parser here): :class:`RendezvousConfigError`, one line naming the option and the
accepted forms. Imports neither torch nor a backend client.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import ClassVar, Mapping, TypeVar, Union

from backends.endpoints import Endpoint, parse_endpoint, parse_endpoints
from backends.errors import EndpointError
from elastic.rendezvous.conf import ConfValues
from elastic.rendezvous.errors import RendezvousConfigError
from elastic.rendezvous.secret_sources import (  # noqa: F401 - Secret, SecretFile are part of this API
    MAX_SECRET_FILE_BYTES, Secret, SecretFile, SecretSource, secret_source,
)

ETCD_DEFAULT_PORT = 2379
STORE_DEFAULT_PORT = 29400
STATIC_DEFAULT_ADDR = "127.0.0.1"
STATIC_DEFAULT_PORT = 29500

ETCD_NAMES = ("etcd", "etcd-v3")
STORE_NAMES = ("tcp", "c10d")
BACKEND_NAMES = (*ETCD_NAMES, *STORE_NAMES, "static")

DEFAULT_MAX_RESPONSE_BYTES = 32 * 1024 * 1024
"""The etcd client's response limit unless ``max_response_bytes`` is given (the etcd backend's default)."""

OPEN_STORE_OPTION = "insecure_open_store"
"""``--rdzv-conf`` option that lets a c10d host serve its store off loopback without a token."""


# -- shared parts ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timeouts:
    """Seconds to connect (``dial_timeout``) and for one request (``request_timeout``, torch's ``read_timeout``)."""

    dial: float
    request: float

    def conf_text(self) -> str:
        return f"dial_timeout={self.dial:g},request_timeout={self.request:g}"


ETCD_TIMEOUTS = Timeouts(dial=5.0, request=5.0)
STORE_TIMEOUTS = Timeouts(dial=5.0, request=10.0)


def _timeouts(values: ConfValues, default: Timeouts) -> Timeouts:
    """``read_timeout`` (torch's name) wins over ``request_timeout`` when both are given."""
    dial, request, read = (values.seconds(key) for key in ("dial_timeout", "request_timeout", "read_timeout"))
    return Timeouts(dial=_given(dial, default.dial), request=_given(read, _given(request, default.request)))


# -- etcd --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EtcdCredentials:
    """etcd user/password authentication (``user=`` with ``password=`` or ``password_file=``)."""

    user: str
    password: SecretSource


@dataclass(frozen=True)
class ClientCertificate:
    """A TLS client certificate and its key (``cert=``, ``key=``), for servers with ``--client-cert-auth``."""

    cert: str
    key: str


@dataclass(frozen=True)
class EtcdSpec:
    """An etcd v3 cluster: its members (tried in order), TLS files, credentials and client limits."""

    name: str
    endpoints: tuple[Endpoint, ...]
    ca_cert: str | None = None
    client_certificate: ClientCertificate | None = None
    credentials: EtcdCredentials | None = None
    timeouts: Timeouts = ETCD_TIMEOUTS
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES

    @property
    def endpoint_text(self) -> str:
        return ",".join(_endpoint_text(endpoint) for endpoint in self.endpoints)

    def conf_text(self) -> str:
        """The connection options in ``--rdzv-conf`` form, secrets masked."""
        parts = [f"cacert={self.ca_cert}"] if self.ca_cert else []
        if self.client_certificate:
            parts += [f"cert={self.client_certificate.cert}", f"key={self.client_certificate.key}"]
        if self.credentials:
            parts += [f"user={self.credentials.user}", self.credentials.password.conf_text()]
        return ",".join([*parts, self.timeouts.conf_text(), f"max_response_bytes={self.max_response_bytes}"])


def etcd_endpoints(text: str) -> tuple[Endpoint, ...]:
    """``--rdzv-endpoint`` for etcd: ``[https://]host[:port],...`` (port 2379) or ``unix:///path``.

    Raises:
        RendezvousConfigError: empty or malformed (credentials in it are redacted).
    """
    try:
        return parse_endpoints(text, ETCD_DEFAULT_PORT, allow_unix=True)
    except EndpointError as error:
        raise RendezvousConfigError(str(error)) from error


def etcd_spec(name: str, endpoints: tuple[Endpoint, ...], conf: Mapping[str, str]) -> EtcdSpec:
    """The etcd backend ``name`` at ``endpoints`` with the connection keys of ``conf``.

    ``protocol=https`` turns http endpoints into https ones. Keys for other backends are unused.

    Raises:
        RendezvousConfigError: a bad value, a user without a password (or the reverse), a
            certificate without its key (or the reverse), or ``etcd_transport`` other than grpcio.
    """
    values = ConfValues(conf)
    transport = values.text("etcd_transport")
    if transport is not None and transport.strip().lower() != "grpcio":
        raise RendezvousConfigError(
            f"The rendezvous option etcd_transport={transport[:100]} was removed: the etcd client always uses "
            "grpcio; drop etcd_transport from --rdzv-conf."
        )
    if values.choice("protocol", ("http", "https")) == "https":
        endpoints = tuple(replace(e, scheme="https") if e.scheme == "http" else e for e in endpoints)
    return EtcdSpec(
        name=name,
        endpoints=endpoints,
        ca_cert=values.text("cacert"),
        client_certificate=_client_certificate(values),
        credentials=_credentials(values),
        timeouts=_timeouts(values, ETCD_TIMEOUTS),
        max_response_bytes=_given(values.whole("max_response_bytes", 1, "a whole number of bytes >= 1"),
                                  DEFAULT_MAX_RESPONSE_BYTES),
    )


def _credentials(values: ConfValues) -> EtcdCredentials | None:
    user, password = values.text("user"), secret_source(values, "password")
    if user is None and password is None:
        return None
    if not user:
        raise RendezvousConfigError("An etcd password was given without a user name; set --rdzv-conf user= and "
                                    "password_file= (or password=) together, or neither.")
    if password is None:
        raise RendezvousConfigError(f"The etcd user {user[:100]!r} was given without a password; set --rdzv-conf "
                                    "password_file= (or password=) too, or drop user=.")
    return EtcdCredentials(user, password)


def _client_certificate(values: ConfValues) -> ClientCertificate | None:
    cert, key = values.text("cert"), values.text("key")
    if cert is None and key is None:
        return None
    if not cert or not key:
        raise RendezvousConfigError("An etcd client certificate needs its key and a key needs its certificate; "
                                    "set --rdzv-conf cert= and key= together.")
    return ClientCertificate(cert, key)


# -- the built-in store ------------------------------------------------------------------------


class Hosting(enum.Enum):
    """Whether this node hosts the built-in store it connects to (fixed once parsed).

    ``CONNECT``: never (``tcp``; ``c10d`` with ``is_host=0``). ``HOST``: always (``c10d`` with
    ``is_host=1``). ``BY_ADDRESS``: when the endpoint names this machine (``c10d``'s default).
    """

    CONNECT = "connect"
    HOST = "host"
    BY_ADDRESS = "by address"


@dataclass(frozen=True)
class StoreSpec:
    """The built-in TCP store at one endpoint: its token, who hosts it, and timeouts."""

    name: str
    endpoint: Endpoint
    token: SecretSource | None = None
    hosting: Hosting = Hosting.CONNECT
    insecure_open_store: bool = False
    timeouts: Timeouts = STORE_TIMEOUTS

    @property
    def endpoint_text(self) -> str:
        return self.endpoint.netloc

    def conf_text(self) -> str:
        parts = [self.token.conf_text()] if self.token else []
        if self.hosting is not Hosting.BY_ADDRESS and self.name == "c10d":
            parts.append(f"is_host={int(self.hosting is Hosting.HOST)}")
        if self.insecure_open_store:
            parts.append(f"{OPEN_STORE_OPTION}=1")
        return ",".join([*parts, self.timeouts.conf_text()])


def store_endpoint(name: str, text: str) -> Endpoint:
    """``--rdzv-endpoint`` for the built-in store: one ``host[:port]`` (port 29400).

    Raises:
        RendezvousConfigError: several endpoints, a malformed one, or one asking for TLS.
    """
    if "," in text:
        raise RendezvousConfigError(f"The {name} backend takes one HOST[:PORT] (got {text[:100]!r}).")
    try:
        endpoint = parse_endpoint(text, STORE_DEFAULT_PORT)
    except EndpointError as error:
        raise RendezvousConfigError(str(error)) from error
    if endpoint.scheme != "http":
        raise RendezvousConfigError(f"The {name} backend's endpoint {text[:100]!r} asks for TLS, which the built-in "
                                    "store lacks; use HOST[:PORT].")
    return endpoint


def store_spec(name: str, endpoint: Endpoint, conf: Mapping[str, str]) -> StoreSpec:
    """The built-in store backend ``name`` (``tcp`` or ``c10d``) at ``endpoint`` with the keys of ``conf``.

    Only ``c10d`` hosts a store (``is_host``, ``insecure_open_store``); ``tcp`` connects to one.

    Raises:
        RendezvousConfigError: a bad value.
    """
    values = ConfValues(conf)
    hosting, open_store = Hosting.CONNECT, False
    if name == "c10d":
        is_host = values.switch("is_host")
        hosting = Hosting.BY_ADDRESS if is_host is None else Hosting.HOST if is_host else Hosting.CONNECT
        open_store = bool(values.switch(OPEN_STORE_OPTION))
    return StoreSpec(name, endpoint, secret_source(values, "token"), hosting, open_store, _timeouts(values, STORE_TIMEOUTS))


@dataclass(frozen=True)
class StandaloneSpec:
    """``--standalone``: the runner hosts a store on a free loopback port under a random token."""

    timeouts: Timeouts = STORE_TIMEOUTS
    name: ClassVar[str] = "c10d"
    endpoint_text: ClassVar[str] = "a free local port"

    def hosted_at(self, endpoint: Endpoint, token: str) -> StoreSpec:
        """The spec of the store once it listens at ``endpoint``."""
        return StoreSpec("tcp", endpoint, Secret("token", token), Hosting.CONNECT, False, self.timeouts)

    def conf_text(self) -> str:
        return self.timeouts.conf_text()


def standalone_spec(conf: Mapping[str, str]) -> StandaloneSpec:
    """``--standalone`` with the store's timeouts from ``conf`` (its token is always a fresh one).

    Raises:
        RendezvousConfigError: a bad timeout.
    """
    return StandaloneSpec(_timeouts(ConfValues(conf), STORE_TIMEOUTS))


# -- static ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StaticSpec:
    """Fixed ranks, no store: this node's rank and where rank 0's workers meet."""

    node_rank: int = 0
    master: Endpoint = Endpoint(STATIC_DEFAULT_ADDR, STATIC_DEFAULT_PORT)
    name: ClassVar[str] = "static"

    @property
    def endpoint_text(self) -> str:
        return self.master.netloc

    def conf_text(self) -> str:
        return f"node_rank={self.node_rank}"


BackendSpec = Union[EtcdSpec, StoreSpec, StaticSpec, StandaloneSpec]
StoreBackedSpec = Union[EtcdSpec, StoreSpec]


def spec_from_conf(name: str, endpoint: str, conf: Mapping[str, str]) -> StoreBackedSpec:
    """The spec of the store-backed backend ``name`` at ``endpoint`` (for callers other than the CLI,
    which words its errors per flag).

    Raises:
        RendezvousConfigError: an unknown or static backend, a malformed endpoint or a bad value.
    """
    if name in ETCD_NAMES:
        return etcd_spec(name, etcd_endpoints(endpoint), conf)
    if name in STORE_NAMES:
        return store_spec(name, store_endpoint(name, endpoint), conf)
    raise RendezvousConfigError(
        f"Unknown store-backed rendezvous backend {name!r}; choose one of {', '.join(ETCD_NAMES + STORE_NAMES)}."
    )


def _endpoint_text(endpoint: Endpoint) -> str:
    """An etcd member as it would be typed: ``https://host:port``, ``host:port``, ``unix:/path``."""
    return f"https://{endpoint.netloc}" if endpoint.scheme == "https" else endpoint.netloc



_T = TypeVar("_T")


def _given(value: _T | None, default: _T) -> _T:
    return default if value is None else value
