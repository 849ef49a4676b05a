"""Prefix watches multiplexed on one etcd Watch stream per client, resumed across restarts.

etcd's Watch RPC is a bidirectional stream that carries any number of watches, told apart by
the ``watch_id`` etcd assigns when it confirms each create. A :class:`WatchHub` keeps one such
stream open for its client and puts every :meth:`~WatchHub.watch` on it, as etcd's Go client
does. Why: in gRPC's Python client each open stream costs a blocked reader thread plus a
request thread, and gRPC wakes every blocked stream reader every 100 ms; with a stream per
watch, a process hosting a few hundred rendezvous nodes spent its CPU on those wake-ups, not
on etcd (profiled at 1024 simulated nodes). With one stream, a new watch is one request
message and a cancel another, and every response is routed by its watch id into that watch's
:class:`~backends.api.QueueWatch` by the hub's own thread iterating the stream, which also
reopens a broken stream.

Routing: etcd answers creates in the order it received them (its server handles one stream's
requests in order and sends create confirmations through one ordered control channel, and
holds back a new watch's events until its confirmation is sent), so confirmations are matched
to pending creates first-in, first-out.

Resuming: when the stream breaks (an RPC error, the stream ending, etcd restarting) the reader
opens a new one, on any endpoint, and re-creates every live watch from its own resume point,
``max(delivered revision, last progress notification) + 1``, so every consumer sees every
event once. Progress keeps that point fresh while a prefix is quiet: etcd's own notifications
(``progress_notify``) come only every 10 minutes, and resuming from the last event + 1 after a
quiet hour asks for history that any compaction since has removed (then the consumer must
re-read). So the stream's request side sends a ``WatchProgressRequest`` after every
``watch_progress_interval`` seconds without a request (no thread of its own, see
:class:`~backends.etcd.request_queue.RequestQueue`), and etcd answers with its revision for
every watch of the stream (watch id -1). Etcd 3.4 and 3.5 before 3.5.8 send that answer on a
channel that can overtake events still queued for a watch, and also while a watch is still
catching up; so a watch adopts a report's revision only when the next report arrives, an
interval later (:meth:`WatchRegistration.note_stream_progress`). It keeps trying for as long as no endpoint answers, as etcd's Go client does, and
warns every ``watch_reconnect_timeout`` seconds meanwhile: an outage is never the end of a
watch (the contract, :mod:`backends.api`; the rendezvous relies on it for static stability).
A watch whose history from there has been compacted fails alone with
:class:`~backends.errors.CompactedError`; a watch the server refuses (say, no read permission
on its prefix) fails alone with the translated error; a refusal of the stream itself (wrong
credentials, not etcd) fails every live watch with it.

Why not the ``etcd3`` library's watcher: when etcd restarts its watcher thread dies with
``NameError: name 'six' is not defined`` and every watch on it is lost silently; it never
re-establishes a watch, allows one pending create at a time, and cannot resume from a revision.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

import grpc
from etcd3 import etcdrpc

from backends.api import QueueWatch
from backends.errors import (
    BackendAuthError,
    BackendClosedError,
    BackendConnectionError,
    BackendError,
    BackendTimeoutError,
    CompactedError,
)
from backends.etcd.connection import CallOptions, EndpointChannel, EtcdConnection, persistent_policy
from backends.etcd.convert import watch_event
from backends.etcd.translate import translate_watch_cancel
from backends.etcd.request_queue import RequestQueue
from backends.etcd.watch_state import WatchRegistration, WatchStream

__all__ = ["STREAM_WIDE", "WatchHub", "WatchRegistration", "WatchStream"]

log = logging.getLogger(__name__)

_TRANSIENT = (BackendConnectionError, BackendTimeoutError)

_PROGRESS_REQUEST = etcdrpc.WatchRequest(progress_request=etcdrpc.WatchProgressRequest())

STREAM_WIDE = -1
"""The watch id of etcd's answer to a progress request: it concerns every watch of the stream."""


class WatchHub:
    """Every watch of one client on one resuming Watch stream (see the module docstring).

    Thread-safe. The reader thread starts with the first watch and ends at :meth:`close`.
    """

    def __init__(self, connection: EtcdConnection) -> None:
        self._connection = connection
        self._lock = threading.Condition()
        self._live: set[WatchRegistration] = set()
        self._stream: WatchStream | None = None
        self._closed = False
        self._stopped = threading.Event()
        self._budget = connection.config.watch_reconnect_timeout
        self._policy = dataclasses.replace(
            persistent_policy(connection.config.retry, self._budget), sleep=self._stopped.wait
        )
        self._thread: threading.Thread | None = None

    # -- consumer side -----------------------------------------------------------------------
    def watch(self, prefix: str, start_revision: int | None, confirm_timeout: float = 30.0) -> QueueWatch:
        """Start watching ``prefix`` from ``start_revision``.

        With a start revision this returns at once (no round trip). With None ("from now") it
        returns once etcd confirmed the watch, whose ``last_revision`` is then etcd's revision
        at that moment: etcd serves a watch from now as events happen, while one from a past
        revision waits for its catch-up loop (every 100 ms).

        Raises:
            BackendClosedError: the hub (its client) was closed.
            BackendTimeoutError: etcd did not confirm a watch from now within ``confirm_timeout``.
        """
        registration = WatchRegistration(self.cancel, prefix, start_revision)
        with self._lock:
            if self._closed:
                raise BackendClosedError(f"etcd watch {prefix!r}: the client was closed; open a new EtcdBackend.")
            self._live.add(registration)
            if self._stream is not None:
                self._stream.create(registration)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="etcd-watch-hub", daemon=True)
                self._thread.start()
            self._lock.notify_all()
        if not registration.started.wait(confirm_timeout):
            registration.watch.cancel()
            raise BackendTimeoutError(
                f"etcd did not confirm the watch on {prefix!r} within {confirm_timeout:g}s; check etcd's health."
            )
        return registration.watch

    def cancel(self, registration: WatchRegistration) -> None:
        """Drop ``registration`` and cancel it on the server (called when its watch is cancelled)."""
        with self._lock:
            registration.cancelled = True
            registration.started.set()
            self._live.discard(registration)
            stream = self._stream
            if stream is not None:
                watch_id = stream.forget(registration)
                if watch_id is not None:
                    stream.cancel_on_server(watch_id)
                # A create still pending is cancelled when its confirmation arrives.

    @property
    def live_count(self) -> int:
        """Watches being kept alive (for tests and diagnostics)."""
        with self._lock:
            return len(self._live)

    def interrupt(self) -> None:
        """Fault injection for tests: break the current stream as a network failure would."""
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.call.cancel()

    def close(self) -> None:
        """End the stream and cancel every watch (their ``get`` raises BackendClosedError); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stopped.set()
            registrations = list(self._live)
            self._live.clear()
            stream, self._stream = self._stream, None
            self._lock.notify_all()
        if stream is not None:
            stream.close()
        for registration in registrations:
            registration.watch.cancel()  # which calls cancel() above, releasing a waiting creator

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the reader thread to end after :meth:`close`; True if it did."""
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        return not thread.is_alive()

    # -- the reader thread -------------------------------------------------------------------
    def _run(self) -> None:
        down_since: float | None = None
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._live or self._closed)
                if self._closed:
                    return
            try:
                stream = self._connection.call("watch", self._open, budget=self._budget, policy=self._policy)
            except _TRANSIENT as error:  # no endpoint answered within the budget: warn, keep trying
                down_since = time.monotonic() if down_since is None else down_since
                log.warning("etcd watch stream: no endpoint answered for %.0fs (%s); %d watches keep waiting to "
                            "resume", time.monotonic() - down_since, error, self.live_count)
                self._stopped.wait(self._policy.max_backoff)
                continue
            except BackendError as error:
                self._fail_all(error)
                continue
            except Exception as error:  # a bug must not end every watch silently
                log.exception("etcd watch stream: internal error while opening")
                self._fail_all(BackendError(f"etcd watches stopped on an internal error: {error!r}"))
                continue
            if stream is None:
                continue
            if down_since is not None:
                log.warning("etcd watch stream on %s resumed %d watches after %.0fs", stream.channel, self.live_count,
                            time.monotonic() - down_since)
                down_since = None
            try:
                self._pump(stream)
            except BackendError as error:
                self._fail_all(error)
            except Exception as error:
                log.exception("etcd watch stream: internal error")
                self._fail_all(BackendError(f"etcd watches stopped on an internal error: {error!r}"))
            finally:
                with self._lock:
                    if self._stream is stream:
                        self._stream = None
                stream.close()

    def _open(self, channel: EndpointChannel, options: CallOptions) -> WatchStream | None:
        """Open a stream on ``channel``, create every live watch on it, and wait for the first answer.

        Returns None when no watch is left to carry. The first answer (up to the request
        timeout) proves the endpoint serves watches; without it the call fails over.
        """
        requests = RequestQueue(idle=lambda: _PROGRESS_REQUEST,
                                idle_after=self._connection.config.watch_progress_interval)
        call = channel.watch.Watch(requests, metadata=options.metadata, wait_for_ready=False)
        token = next((value for name, value in options.metadata if name == "token"), None)
        stream = WatchStream(call, requests, channel, token)
        with self._lock:
            if self._closed or not self._live:
                stream.close()
                if self._closed:
                    raise BackendClosedError("etcd watches: the client was closed.")
                return None
            for registration in self._live:
                stream.create(registration)
            self._stream = stream
            count = len(stream.pending)
        try:
            self._handle(self._first_response(stream, options.timeout), stream)
        except BaseException:
            with self._lock:
                if self._stream is stream:
                    self._stream = None
            stream.close()
            raise
        log.debug("etcd watch stream opened on %s carrying %d watches", channel, count)
        return stream

    def _first_response(self, stream: WatchStream, timeout: float) -> Any:
        timer = threading.Timer(timeout, stream.expire)
        timer.daemon = True
        timer.start()
        try:
            return next(stream.call)
        except grpc.RpcError as error:
            if stream.expired:
                raise BackendTimeoutError(
                    f"etcd at {stream.channel} did not confirm a watch within {timeout:.3g}s."
                ) from error
            raise
        except StopIteration:
            raise BackendConnectionError(
                f"etcd at {stream.channel} closed the watch stream before confirming a watch."
            ) from None
        finally:
            timer.cancel()

    def _pump(self, stream: WatchStream) -> None:
        """Route responses until the stream breaks; returns to resume, raises to fail every watch."""
        try:
            for response in stream.call:
                self._handle(response, stream)
        except grpc.RpcError as error:
            if self._stopped.is_set() or stream.renewing_token or self._connection.closed:
                return
            translated = self._connection.translate(error, "watch", stream.channel, None, writes=False, stream=True)
            if isinstance(translated, BackendAuthError) and self._connection.config.user is not None:
                # A token the member forgot (it restarted): the next stream authenticates again.
                stream.channel.forget_token(stream.channel.token)
                log.warning("%s; resuming %d watches with a new token", translated, self.live_count)
                return
            if not isinstance(translated, _TRANSIENT):
                raise translated from error
            count = self.live_count
            log.warning("%s (%d watch%s)", translated, count, "" if count == 1 else "es")
            return
        if not self._stopped.is_set():
            log.warning("etcd watch stream on %s ended; resuming %d watches", stream.channel, self.live_count)

    def _handle(self, response: Any, stream: WatchStream) -> None:
        """Route one response to its watch (see the module docstring for the matching rule)."""
        failed: tuple[WatchRegistration, BackendError] | None = None
        with self._lock:
            if self._stream is not stream:
                return  # a replaced stream: its watches resume on the new one from their own revisions
            if response.created:
                if not stream.pending:
                    log.warning("etcd at %s confirmed watch %d that was never asked for", stream.channel,
                                response.watch_id)
                    return
                registration = stream.pending.popleft()
                if response.canceled or response.compact_revision:
                    error = self._refusal(registration, response, stream)
                    if self._token_may_have_expired(registration, error):
                        registration.reauthenticated = True
                        stream.channel.forget_token(stream.token)
                        stream.renewing_token = True
                        # Routine (the token lapsed unused): etcd's own words, not the advice for a refusal.
                        log.debug("etcd at %s refused watch %r with the stream's token (%s); authenticating again "
                                  "and resuming every watch", stream.channel, registration.prefix,
                                  response.cancel_reason)
                        stream.call.cancel()  # the reader resumes on a new stream with a new token
                        return
                    failed = registration, error
                elif registration.cancelled:
                    stream.cancel_on_server(response.watch_id)
                    return
                else:
                    registration.reauthenticated = False
                    stream.confirm(registration, response.watch_id)
                    registration.mark_started(response.header.revision)
            elif response.watch_id == STREAM_WIDE and not response.events and not response.canceled:
                for registration in stream.by_id.values():
                    registration.note_stream_progress(response.header.revision)
                return
            else:
                registration = stream.by_id.get(response.watch_id)
                if registration is None:
                    return  # cancelled by its consumer
                if response.canceled or response.compact_revision:
                    stream.forget(registration)
                    failed = registration, self._refusal(registration, response, stream)
            if failed is not None:
                self._live.discard(failed[0])
        if failed is not None:
            registration, error = failed
            log.warning("etcd watch on %r failed: %s", registration.prefix, error)
            registration.fail(error)
        elif response.events:
            registration.watch.deliver([watch_event(event) for event in response.events])
        elif not response.created:
            registration.note_progress(response.header.revision)

    def _token_may_have_expired(self, registration: WatchRegistration, error: BackendError) -> bool:
        """A create refused for auth is retried once with a fresh token.

        etcd checks a Watch stream's token on every create, and a simple token lapses after
        ``--auth-token-ttl`` (300 s) unused: a long-lived stream's token goes stale while its
        watches run. etcd 3.4 reports that as "invalid auth token", 3.5 as "permission denied"
        (so only a refusal with a fresh token is a permission problem)."""
        return (
            isinstance(error, BackendAuthError)
            and self._connection.config.user is not None
            and not registration.reauthenticated
        )

    @staticmethod
    def _refusal(registration: WatchRegistration, response: Any, stream: WatchStream) -> BackendError:
        if response.compact_revision:
            return CompactedError(
                f"etcd watch on {registration.prefix!r} asked for history from revision "
                f"{registration.requested_revision}, but etcd compacted it up to revision "
                f"{response.compact_revision}; re-read the current state and watch from its revision.",
                requested_revision=registration.requested_revision,
                compact_revision=response.compact_revision,
            )
        return translate_watch_cancel(response.cancel_reason, prefix=registration.prefix, endpoint=str(stream.channel))

    def _fail_all(self, error: BackendError) -> None:
        with self._lock:
            if self._closed:
                return
            registrations = list(self._live)
            self._live.clear()
        if registrations and not isinstance(error, BackendClosedError):  # closing is not news
            log.warning("etcd watches failed (%d watches): %s", len(registrations), error)
        for registration in registrations:
            registration.fail(error)
