"""gRPC channels to the etcd endpoints: dialing, auth tokens, failover and retries.

One channel per endpoint. A call goes to the endpoint that last worked; when that endpoint
cannot be reached the call moves on to the next one, and a round over all endpoints is retried
with the config's :class:`~backends.retry.RetryPolicy` until the call's deadline. A request is
resent after a failure only when that is safe: always if it was never sent (no connection), and
otherwise only for requests marked ``resend_safe`` (reads, unconditional puts, keepalives).
A write that is not is given up as of unknown outcome as soon as its member reports that the
leader it was sent under is gone (:mod:`backends.etcd.leader_watch`), not at ``request_timeout``.

Auth: with a user and password, each endpoint gets its own token (etcd's simple tokens are
valid only on the member that issued them and are lost when it restarts); a request refused
for auth reasons with a token that is not fresh re-authenticates once and is sent again.

TLS: the CA, certificate and key files are read again before a channel that is not connected
is used (a reconnect, a retry after a failed handshake), and the channel is opened anew when
they changed (:mod:`backends.etcd.tls_files`), so a certificate rotation needs no restart. A
failed handshake is the files' fault until a call has worked (fail fast, in one line), and an
outage after: etcd came back with a certificate the files do not trust yet.

Why not ``etcd3.MultiEndpointEtcd3Client``: it authenticates once against one random member,
marks a failed endpoint unusable for 300 s (so a restarted single member is refused
client-side), drops the header revision of transactions, and replaces gRPC errors by
exceptions without the details we need for translation. We use the same generated ``etcd3``
stubs (the etcd v3 gRPC API) directly instead.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

import grpc
from etcd3 import etcdrpc

from backends.endpoints import Endpoint
from backends.errors import (
    BackendAuthError,
    BackendClosedError,
    BackendConnectionError,
    BackendError,
    BackendTimeoutError,
    ProtocolError,
)
from backends.etcd.channel_options import ChannelLimits, channel_options, request_limit
from backends.etcd.config import EtcdConfig
from backends.etcd.leader_watch import WriteWatch, member_status, raft_term
from backends.etcd.translate import DialFailure, RequestNotSent, merge_not_sent, translate_rpc_error
from backends.etcd.tls_files import TlsFiles
from backends.retry import RetryPolicy

log = logging.getLogger(__name__)

T = TypeVar("T")

MIN_ENDPOINT_SHARE = 1.0
"""Seconds an endpoint gets at least, within a call's deadline, before a resendable call moves on."""

_READY = grpc.ChannelConnectivity.READY
_FAILED = grpc.ChannelConnectivity.TRANSIENT_FAILURE
_SHUTDOWN = grpc.ChannelConnectivity.SHUTDOWN

_POLLER_PERIOD = 0.2
"""How often gRPC's Python connectivity poller wakes (grpc/_channel.py)."""


@dataclass(frozen=True)
class CallOptions:
    """Per-attempt RPC settings handed to an invoke function.

    ``watch``: for a write that must not be resent, what abandons it once the etcd leader it
    was sent under is gone (see :mod:`backends.etcd.leader_watch`); None for other requests.
    """

    timeout: float
    metadata: tuple[tuple[str, str], ...]
    watch: WriteWatch | None = None

    @property
    def kwargs(self) -> dict[str, object]:
        """Keyword arguments for a unary stub call (fail fast when not connected)."""
        return {"timeout": self.timeout, "metadata": self.metadata, "wait_for_ready": False}

    def unary(self, method: grpc.UnaryUnaryMultiCallable, request: object) -> Any:
        """Send ``request`` with a stub's ``method`` and return the response.

        Raises:
            grpc.RpcError: the request failed.
            BackendTimeoutError: the write was abandoned after a leader change (``watch``).
        """
        if self.watch is None:
            return method(request, **self.kwargs)
        deadline = self.watch.clock() + self.timeout
        return self.watch.result(method.future(request, **self.kwargs), deadline)


class EndpointChannel:
    """One endpoint: its grpcio channel and stubs, its auth token, and its connectivity state.

    ``generation``: that of the TLS files (:class:`~backends.etcd.tls_files.TlsFiles`) the
    channel's credentials were built from; :meth:`renew_credentials` opens it anew with newer ones.
    """

    def __init__(
        self, endpoint: Endpoint, credentials: grpc.ChannelCredentials | None, options: tuple[tuple[str, int], ...],
        generation: int = 0,
    ) -> None:
        self.endpoint = endpoint
        self._options = options
        self.raft_term: int | None = None  # the term in the newest response seen from this member
        self.token: str | None = None
        self._token_lock = threading.Lock()  # held only to read or swap the token, never across a call
        self.authenticating = threading.Lock()  # one Authenticate call at a time per endpoint
        self._state_changed = threading.Condition()
        self._closed = False
        with self._state_changed:
            self._open(credentials)
        self.generation = generation

    def _open(self, credentials: grpc.ChannelCredentials | None, connect: bool = False) -> None:
        """Make a new grpcio channel and its stubs the current ones (under ``_state_changed``);
        ``connect``: start connecting it now (a caller may be waiting in :meth:`dial` already)."""
        target = self.endpoint.netloc
        if credentials is None:
            channel = grpc.insecure_channel(target, options=self._options)
        else:
            channel = grpc.secure_channel(target, credentials, options=self._options)
        self.channel = channel
        self.kv = etcdrpc.KVStub(channel)
        self.lease = etcdrpc.LeaseStub(channel)
        self.watch = etcdrpc.WatchStub(channel)
        self.auth = etcdrpc.AuthStub(channel)
        self.maintenance = etcdrpc.MaintenanceStub(channel)
        self._state = grpc.ChannelConnectivity.IDLE
        self._subscription = (channel, functools.partial(self._on_state, channel))
        channel.subscribe(self._subscription[1], try_to_connect=connect)

    def __str__(self) -> str:
        return str(self.endpoint)

    @property
    def connected(self) -> bool:
        """Whether the channel has a working connection now (no I/O)."""
        return self._state == _READY

    def renew_credentials(self, credentials: grpc.ChannelCredentials, generation: int) -> None:
        """Go on with a new grpcio channel built with ``credentials`` (of TLS files ``generation``).

        Calls still on the old channel end with CANCELLED when it is closed (as in :meth:`close`);
        they were waiting for a connection the old credentials could not make.
        """
        with self._state_changed:
            if generation <= self.generation or self._closed:
                return  # another thread renewed it already, or the client was closed
            old = self._subscription
            self._open(credentials, connect=True)
            self.generation = generation
            self._state_changed.notify_all()
        _close_later(*old, name=f"etcd-channel-close {self.endpoint}")

    def dial(self, timeout: float) -> bool:
        """Connect unless connected; False when still connecting after ``timeout`` (nothing answered).

        A failed connect is left to the next call, which then fails at once with gRPC's reason.
        """
        if self._state in (_READY, _FAILED):
            return True
        kick = grpc.channel_ready_future(self.channel)  # starts connecting an idle channel
        try:
            with self._state_changed:
                return self._state_changed.wait_for(lambda: self._state in (_READY, _FAILED, _SHUTDOWN), timeout)
        finally:
            kick.cancel()

    def forget_token(self, stale: str | None) -> None:
        """Drop the token if it is still ``stale`` (another thread may have refreshed it)."""
        with self._token_lock:
            if self.token == stale:
                self.token = None

    def token_or_authenticate(self, authenticate: Callable[[], str]) -> str:
        """The current token, or a new one from ``authenticate()`` (one caller at a time does it).

        The Authenticate call runs without the token lock, so the watch hub's reader may drop a
        stale token (forget_token, on a watch refused for auth) without waiting for a slow call.
        """
        token = self.token
        if token is not None:
            return token
        with self.authenticating:
            with self._token_lock:
                token = self.token
            if token is None:
                token = authenticate()
                with self._token_lock:
                    self.token = token
            return token

    def close(self) -> None:
        """Stop watching the state and close the channel once gRPC's state poller has let go
        (see :func:`_close_later`). Calls in flight end with CANCELLED (then BackendClosedError)."""
        with self._state_changed:
            self._closed = True
            channel, callback = self._subscription
        _close_later(channel, callback, name=f"etcd-channel-close {self.endpoint}")

    def _on_state(self, channel: grpc.Channel, state: grpc.ChannelConnectivity) -> None:
        with self._state_changed:
            if channel is self.channel:  # not a late report from a replaced channel
                self._state = state
                self._state_changed.notify_all()


def _close_later(channel: grpc.Channel, callback: Callable[[grpc.ChannelConnectivity], None], name: str) -> None:
    """Stop watching ``channel``'s state and close it once gRPC's state poller has let go.

    gRPC polls a subscribed channel's state from a thread that wakes every 0.2 s; closing the
    channel under it makes that thread die with "Channel closed!". So the close is deferred, to
    a thread that is not a daemon: a process that exits right after closing waits for it (0.3 s
    at most) while every gRPC thread still runs. A daemon closer would never run in such a
    process, and the channel would go into interpreter finalization open, gRPC's threads and
    calls still in it.
    """
    channel.unsubscribe(callback)
    closer = threading.Timer(_POLLER_PERIOD * 1.5, channel.close)
    closer.name = name
    closer.start()


Invoke = Callable[[EndpointChannel, CallOptions], T]


class EtcdConnection:
    """Channels to every configured endpoint and the failover/retry loop around each call.

    Raises (from the constructor):
        EndpointError: a certificate file cannot be read.
    """

    def __init__(self, config: EtcdConfig) -> None:
        self.config = config
        self._tls = TlsFiles(config.ca_cert, config.client_cert, config.client_key) if config.tls else None
        self._channels: list[EndpointChannel] = _endpoint_channels(config, self._tls)
        self._current = 0
        self._closed = False
        self._served = False  # a call has worked: a failed TLS handshake is from now on an outage
        self._default_policy = _bounded(config.retry, config.request_timeout)

    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self, operation: str) -> None:
        """Raise BackendClosedError once the connection is closed."""
        if self._closed:
            raise BackendClosedError(f"etcd {operation}: the client was closed; open a new EtcdBackend.")

    def call(
        self,
        operation: str,
        invoke: Invoke[T],
        *,
        resend_safe: bool = True,
        budget: float | None = None,
        policy: RetryPolicy | None = None,
        writes: bool = True,
    ) -> T:
        """Run ``invoke(channel, options)`` against the cluster with failover and retries.

        Args:
            operation: what is done, for messages (e.g. ``"put '/a'"``).
            invoke: sends the request on the given endpoint; may raise ``grpc.RpcError``.
            resend_safe: the request may be sent again after an unknown outcome.
            budget: seconds for the whole call (default: request_timeout).
            policy: backoff between rounds (default: the config's, bounded by ``budget``).
            writes: the request may change something (False for reads: their errors never say
                "whether it applied is unknown").

        Raises:
            BackendClosedError: the connection was closed.
            RequestNotSent: no endpoint could be reached (nothing was sent).
            BackendConnectionError, BackendTimeoutError: the call failed after being sent.
            BackendError: whatever the server refused, translated.
        """
        self.check_open(operation)
        budget = self.config.request_timeout if budget is None else budget
        deadline = time.monotonic() + budget
        if policy is None:
            policy = self._default_policy if budget == self.config.request_timeout else _bounded(self.config.retry, budget)
        retry_on: tuple[type[BaseException], ...] = (
            (BackendConnectionError, BackendTimeoutError) if resend_safe else (RequestNotSent,)
        )

        def log_retry(attempt: int, error: BaseException) -> None:
            log.info("etcd %s: attempt %d failed (%s); retrying", operation, attempt, error)

        return policy.run(lambda: self._round(operation, invoke, resend_safe, deadline, writes), retry_on, log_retry)

    def close(self) -> None:
        """Close every channel (in-flight calls end with BackendClosedError); idempotent."""
        if self._closed:
            return
        self._closed = True
        for channel in self._channels:
            channel.close()

    # -- one round over the endpoints --------------------------------------------------------
    def _rotation(self) -> Iterator[tuple[int, EndpointChannel]]:
        start = self._current
        for offset in range(len(self._channels)):
            index = (start + offset) % len(self._channels)
            yield index, self._channels[index]

    def _round(self, operation: str, invoke: Invoke[T], resend_safe: bool, deadline: float, writes: bool = True) -> T:
        """One pass over the endpoints, the current one first.

        A request that may be resent gives each endpoint only its share of what is left of the
        deadline (at least :data:`MIN_ENDPOINT_SHARE` s), so a member that hangs (stopped, its disk
        stalled) does not take the whole call: the call moves on to the next member. An endpoint
        that timed out or dropped the connection loses its place as the current one, so the next
        call, a write included, starts elsewhere.
        """
        failures: list[BackendError] = []
        share = max((deadline - time.monotonic()) / len(self._channels), MIN_ENDPOINT_SHARE)
        for index, channel in self._rotation():
            self.check_open(operation)
            if deadline - time.monotonic() <= 0:
                break
            attempt_deadline = min(deadline, time.monotonic() + share) if resend_safe else deadline
            try:
                result = self._call_on(channel, operation, invoke, attempt_deadline, writes,
                                       watched=writes and not resend_safe)
            except RequestNotSent as error:
                failures.append(error)
            except (BackendConnectionError, BackendTimeoutError) as error:
                self._demote(index, error)
                if not resend_safe or self._closed:
                    raise
                failures.append(error)
            else:
                if index != self._current:
                    log.info("etcd: now using endpoint %s", channel)
                    self._current = index
                return result
            log.debug("etcd %s: endpoint %s failed: %s", operation, channel, failures[-1])
        raise self._round_failure(operation, failures)

    def _demote(self, index: int, error: BackendError) -> None:
        """Move the current endpoint on past ``index`` after it failed a sent request."""
        if index == self._current and len(self._channels) > 1:
            self._current = (index + 1) % len(self._channels)
            log.info("etcd: endpoint %s failed (%s); trying %s first from now on", self._channels[index], error,
                     self._channels[self._current])

    def _round_failure(self, operation: str, failures: list[BackendError]) -> BackendError:
        if not failures:
            return RequestNotSent(
                f"etcd {operation}: no endpoint of {self.config.endpoint_list} answered in time; "
                "check that etcd is running, or raise request_timeout."
            )
        kinds = {error.kind if isinstance(error, RequestNotSent) else None for error in failures}
        merged = merge_not_sent(failures)
        summary = str(merged) if merged is not None else " ".join(str(error) for error in failures)
        error: BackendError
        if kinds == {DialFailure.PROTOCOL}:
            error = ProtocolError(summary if merged else f"etcd {operation}: no endpoint speaks the etcd v3 API. {summary}")
        elif kinds == {DialFailure.TLS}:
            return self._tls_failure(summary if merged else f"etcd {operation}: TLS failed with every endpoint. {summary}",
                                     failures[-1])
        elif merged is not None:
            return merged
        elif len(failures) == 1:
            return failures[0]
        elif all(isinstance(failure, RequestNotSent) for failure in failures):
            error = RequestNotSent(f"etcd {operation}: no endpoint could be reached. {summary}")
        else:
            error = type(failures[-1])(f"etcd {operation} failed on every endpoint. {summary}")
        error.__cause__ = failures[-1]
        return error

    def _tls_failure(self, text: str, cause: BackendError) -> BackendError:
        """A TLS handshake that failed with every endpoint: for good before any call worked (the
        files do not match the server: fail fast), an outage after (etcd came back with a
        certificate the files do not trust yet, a rotation half done): retried like one, the
        files read again before each attempt. Either names which file was read when."""
        files = self._tls.describe() if self._tls is not None else "none"
        error: BackendError
        if not self._served:
            error = BackendAuthError(f"{text} TLS files: {files}.")
        else:
            error = RequestNotSent(f"{text} It worked before, so this is taken for an outage and retried, the TLS "
                                   f"files read again before each attempt (a certificate from a new CA needs that CA "
                                   f"in the CA file): {files}.", DialFailure.TLS)
        error.__cause__ = cause
        return error

    # -- one endpoint ------------------------------------------------------------------------
    def _call_on(self, channel: EndpointChannel, operation: str, invoke: Invoke[T], deadline: float,
                 writes: bool = True, watched: bool = False) -> T:
        self._dial(channel, deadline)
        fresh = channel.token is None
        stale = channel.token
        try:
            return self._invoke(channel, operation, invoke, deadline, writes, watched)
        except BackendAuthError:
            if self.config.user is None or fresh:
                raise
            # Routine: a simple token lapses after etcd's --auth-token-ttl unused (300 s by default).
            log.debug("etcd %s: token for %s refused; authenticating again", operation, channel)
            channel.forget_token(stale)
            return self._invoke(channel, operation, invoke, deadline, writes, watched)

    def _dial(self, channel: EndpointChannel, deadline: float) -> None:
        """Wait (up to the dial timeout) until the channel is connected or has failed.

        A failed channel is left to the RPC itself, which then fails at once with gRPC's reason.

        A channel that is not connected (a first connection, a reconnect, a retry after a
        failed handshake) gets new credentials first if the TLS files changed on disk.

        Raises:
            RequestNotSent: still connecting when the dial timeout passed.
        """
        if self._tls is not None and not channel.connected:
            self._tls.refresh()
            generation, credentials = self._tls.credentials
            if channel.generation != generation:
                channel.renew_credentials(credentials, generation)
        timeout = max(min(self.config.dial_timeout, deadline - time.monotonic()), 0.0)
        if not channel.dial(timeout):
            raise RequestNotSent(
                f"Could not connect to etcd at {channel} within {timeout:.3g}s: it did not answer; check that "
                "the host is up and reachable and that the port is etcd's client port, or raise dial_timeout."
            )

    def _invoke(self, channel: EndpointChannel, operation: str, invoke: Invoke[T], deadline: float,
                writes: bool = True, watched: bool = False) -> T:
        """Send once on ``channel``; ``watched``: abandon the write if the leader changes under it."""
        remaining = deadline - time.monotonic()
        timeout = max(min(self.config.request_timeout, remaining), 0.001)
        try:
            metadata = self._auth_metadata(channel, timeout)
            watch = None
            if watched:
                watch = WriteWatch(operation, str(channel), channel.raft_term,
                                   lambda probe_timeout: member_status(channel.maintenance, metadata, probe_timeout))
            result = invoke(channel, CallOptions(timeout=timeout, metadata=metadata, watch=watch))
        except grpc.RpcError as error:
            raise self.translate(error, operation, channel, timeout, writes) from error
        self._served = True
        term = raft_term(result)
        if term is not None:
            channel.raft_term = term
        return result

    def translate(
        self, error: grpc.RpcError, operation: str, channel: EndpointChannel, timeout: float | None,
        writes: bool = True, stream: bool = False,
    ) -> BackendError:
        """Translate an RPC error seen on ``channel`` (see :func:`translate_rpc_error`)."""
        return translate_rpc_error(
            error,
            operation=operation,
            endpoint=str(channel),
            tls=self.config.tls,
            timeout=timeout,
            closed=self._closed,
            writes=writes,
            stream=stream,
        )

    # -- auth --------------------------------------------------------------------------------
    def _auth_metadata(self, channel: EndpointChannel, timeout: float) -> tuple[tuple[str, str], ...]:
        if self.config.user is None:
            return ()
        token = channel.token_or_authenticate(lambda: self._authenticate(channel, timeout))
        return (("token", token),) if token else ()

    def _authenticate(self, channel: EndpointChannel, timeout: float) -> str:
        """Get a token for our user from ``channel``'s member ("" when auth is off there).

        Raises:
            BackendAuthError: the user name or password is wrong.
        """
        request = etcdrpc.AuthenticateRequest(name=self.config.user, password=self.config.password)
        try:
            response = channel.auth.Authenticate(request, timeout=timeout, wait_for_ready=False)
        except grpc.RpcError as error:
            details = (error.details() or "") if callable(getattr(error, "details", None)) else ""
            if "authentication is not enabled" in details:
                log.debug("etcd at %s has auth disabled; sending requests without a token", channel)
                return ""
            translated = self.translate(error, f"authenticate as {self.config.user!r}", channel, timeout, writes=False)
            if isinstance(translated, BackendAuthError):
                translated = BackendAuthError(
                    f"etcd at {channel} rejected user {self.config.user!r}: {details}. "
                    "Check --rdzv-conf user= and the password (password_file=)."
                )
            raise translated from error
        return response.token



def _bounded(policy: RetryPolicy, budget: float) -> RetryPolicy:
    total = budget if policy.total_timeout is None else min(policy.total_timeout, budget)
    return dataclasses.replace(policy, total_timeout=total)


def persistent_policy(policy: RetryPolicy, budget: float) -> RetryPolicy:
    """``policy`` retrying as often as fits in ``budget`` seconds (for resuming watches)."""
    return dataclasses.replace(
        policy, max_attempts=max(policy.max_attempts, math.ceil(budget * 100)), total_timeout=budget
    )


def _endpoint_channels(config: EtcdConfig, tls: TlsFiles | None) -> list[EndpointChannel]:
    """One channel per endpoint, with the credentials of ``tls`` (None: plain text)."""
    endpoints: tuple[Endpoint, ...] = config.endpoints  # type: ignore[assignment]
    generation, credentials = tls.credentials if tls is not None else (0, None)
    options = channel_options(ChannelLimits(request_limit(config.max_value_bytes), config.max_response_bytes,
                                            connect_timeout=config.dial_timeout))
    return [EndpointChannel(endpoint, credentials, options, generation) for endpoint in endpoints]
