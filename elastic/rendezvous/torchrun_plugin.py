"""Our rendezvous engine behind stock torchrun: ``torchrun --rdzv-backend=etcd-v3 ...``.

torch discovers this module through the ``torchrun.handlers`` entry-point group (see
``pyproject.toml``): :func:`torch.distributed.elastic.rendezvous.registry` loads
:func:`handler_creator`, calls it with no arguments and registers what it returns, a function
``RendezvousParameters -> RendezvousHandler``, under the entry point's name.

Per round, :class:`TorchrunRendezvousHandler`

1. runs our :class:`~elastic.rendezvous.handler.RendezvousHandler` (etcd v3, DESIGN §3);
2. gives torch's agent the c10d ``Store`` it needs (rank assignment, exit barrier): the rank-0
   node hosts a ``TCPStore`` at the round's ``master_addr:master_port`` (a port our engine picks
   fresh each round), the other nodes connect to it; the store is wrapped in a per-round
   ``PrefixStore``. The port has listened since rank 0's join published it
   (:mod:`elastic.rendezvous.ports`) and the store serves that very socket
   (``master_listen_fd``), so a node that connects before rank 0's store runs waits in the accept
   queue instead of being refused into TCPStore's connect back-off;
3. shares that store with the workers (``use_agent_store``, like torch's dynamic handler), so
   their ``init_process_group`` connects to it as clients via MASTER_ADDR/MASTER_PORT. With
   ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` the workers host their own store on a port rank 0
   publishes through the agent store instead, as torch does.

Our errors reach torch's agent as torch's rendezvous exceptions (``raise ... from``). This module
imports torch; nothing on our own launcher's path imports it.

Options (``--rdzv-conf``) are ours (:mod:`elastic.rendezvous.settings`) plus every key torch's
handlers read, mapped by the same :func:`elastic.rendezvous.conf.from_torch` as ``elasticrun``'s:
``timeout`` (torchrun's launcher always sets it; the join timeout unless ``join_timeout`` is
given), ``ca_cert`` / ``ssl_cert`` / ``ssl_cert_key`` (torch's etcd-v2 TLS keys), ``read_timeout``
(also the agent store's timeout, default 60 s); keys without effect (``heartbeat_timeout``,
``rank``, ...) are logged once, when the handler is created.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import sys
import time
from datetime import timedelta
from typing import Callable, Iterator

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import api as torch_api

from elastic.rendezvous import errors as ours
from elastic.rendezvous.api import MembershipChange, Rendezvous, RendezvousInfo
from elastic.rendezvous.backend_spec import EtcdSpec, etcd_endpoints, etcd_spec
from elastic.rendezvous.conf import OurConf, from_torch, parse_rdzv_conf
from elastic.rendezvous.registry import create_handler
from elastic.rendezvous.secret_sources import (
    RDZV_CONF_VARIABLE, command_line_secret_warning, hide_inline_secrets, inline_secret_options,
)
from elastic.rendezvous.settings import RendezvousSettings, settings_from_conf
from elastic.rendezvous.torchrun_outcome import AgentStore, leaving_after_success, leaving_line, torchrun_job

log = logging.getLogger(__name__)

BACKEND_NAME = "etcd-v3"
"""The ``--rdzv-backend`` name torchrun knows us by (the entry point's name must match)."""

REJOIN_GRACE_S = 3.0
"""How long a member that rejoined is hidden from torch's agent (see ``num_nodes_waiting``)."""

DEFAULT_STORE_TIMEOUT = 60.0
"""Seconds the agent store waits for a connection or a key (torch's c10d ``read_timeout`` default)."""

_ERROR_MAP: tuple[tuple[type[ours.RendezvousError], type[torch_api.RendezvousError]], ...] = (
    (ours.RendezvousClosedError, torch_api.RendezvousClosedError),
    (ours.RendezvousTimeoutError, torch_api.RendezvousTimeoutError),
    (ours.RendezvousConnectionError, torch_api.RendezvousConnectionError),
    (ours.RendezvousSessionLostError, torch_api.RendezvousConnectionError),
    (ours.RendezvousStateError, torch_api.RendezvousStateError),
)

StoreFactory = Callable[[str, int, bool, timedelta, "int | None"], dist.Store]
"""``(host, port, is_master, timeout, listen_fd) -> Store``: how the agent store is opened
(injectable); ``listen_fd`` is the master port's listening socket, owned by the store from then on."""


# -- translation ------------------------------------------------------------------------------
def our_conf(params: torch_api.RendezvousParameters) -> OurConf:
    """Our key/values for torch's ``params.config`` (values as strings, unset ones skipped),
    through the mapping ``elasticrun`` uses (:func:`~elastic.rendezvous.conf.from_torch`), with
    the notes on keys that have no effect.

    Raises:
        ValueError: (our ``RendezvousConfigError``) an unknown key; the message lists the valid ones.
    """
    conf = {key.replace("-", "_"): str(value) for key, value in params.config.items() if value is not None}
    return from_torch(conf, BACKEND_NAME)


def conf_from_params(params: torch_api.RendezvousParameters) -> dict[str, str]:
    """:func:`our_conf`'s key/values: ``timeout`` becomes ``join_timeout`` unless that is given,
    torch's TLS key names become ours, keys without effect (``rank``) are dropped.

    Raises:
        ValueError: (our ``RendezvousConfigError``) an unknown key; the message lists the valid ones.
    """
    return dict(our_conf(params).values)


def settings_from_params(params: torch_api.RendezvousParameters) -> RendezvousSettings:
    """Our settings for torch's parameters.

    Raises:
        ValueError: (our ``RendezvousConfigError``) an unknown option or a bad value; the message
            lists the valid options.
    """
    return settings_from_conf(params.run_id, params.min_nodes, params.max_nodes, conf_from_params(params))


def backend_from_params(params: torch_api.RendezvousParameters) -> EtcdSpec:
    """The etcd spec for torch's parameters: ``params.endpoint`` and the connection options.

    Raises:
        ValueError: (our ``RendezvousConfigError``) no or a malformed endpoint, or a bad option.
    """
    if not params.endpoint:
        raise ours.RendezvousConfigError(
            f"The {BACKEND_NAME} rendezvous backend needs --rdzv-endpoint host:port (etcd's client URL)."
        )
    return etcd_spec(BACKEND_NAME, etcd_endpoints(params.endpoint), conf_from_params(params))


def to_torch_error(error: ours.RendezvousError) -> Exception:
    """torch's rendezvous exception for one of ours (same message); config errors stay ValueErrors."""
    if isinstance(error, ours.RendezvousConfigError):
        return ValueError(str(error))
    for our_type, torch_type in _ERROR_MAP:
        if isinstance(error, our_type):
            return torch_type(str(error))
    return torch_api.RendezvousError(str(error))


@contextlib.contextmanager
def _torch_errors() -> Iterator[None]:
    """Re-raise our rendezvous errors as torch's, chained with ``raise ... from``."""
    try:
        yield
    except ours.RendezvousError as error:
        raise to_torch_error(error) from error


# -- the agent store --------------------------------------------------------------------------
def open_tcp_store(host: str, port: int, is_master: bool, timeout: timedelta, listen_fd: int | None = None) -> dist.Store:
    """A ``TCPStore`` server (``is_master``) on ``port``, or a client of the one at ``host:port``.

    A server given ``listen_fd`` serves that already-listening socket (and closes it when done).

    Raises:
        RuntimeError: (torch's ``DistNetworkError``/``DistStoreError``) the port is taken, or the
            server could not be reached within ``timeout``.
    """
    return dist.TCPStore(
        host_name=host,
        port=port,
        is_master=is_master,
        timeout=timeout,
        wait_for_workers=False,
        multi_tenant=is_master,
        master_listen_fd=listen_fd if is_master else None,
    )


class TorchrunRendezvousHandler(torch_api.RendezvousHandler):
    """torch's ``RendezvousHandler`` interface over our etcd rendezvous engine.

    Args:
        handler: our rendezvous (:class:`~elastic.rendezvous.handler.RendezvousHandler`); this
            adapter owns it and shuts it down.
        node_addr: this node's address (rank 0's is where the agent store is hosted).
        store_timeout: seconds the agent store waits to connect or for a key.
        store_factory: opens the agent store (a real ``TCPStore`` unless a test injects one).
        already_finished_ok: a node that arrives after the job finished exits 0, not 3.

    Every method raises torch's rendezvous exceptions, never ours.
    """

    def __init__(
        self,
        handler: Rendezvous,
        node_addr: str,
        *,
        store_timeout: float = DEFAULT_STORE_TIMEOUT,
        store_factory: StoreFactory = open_tcp_store,
        already_finished_ok: bool = False,
    ) -> None:
        self._handler = handler
        self._already_finished_ok = already_finished_ok
        self._node_addr = node_addr
        self._store_timeout = timedelta(seconds=store_timeout)
        self._store_factory = store_factory
        self._round_store: dist.Store | None = None
        self._joined = False  # a round included this node (so its workers ran)
        self._declared = False
        self._restart_logged = False
        self._rejoin_seen: float | None = None
        self._clock = time.monotonic

    def get_backend(self) -> str:
        return BACKEND_NAME

    @property
    def use_agent_store(self) -> bool:
        """Whether workers reuse the agent store (torch's opt-out: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)."""
        return os.getenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "0") != "1"

    def next_rendezvous(self) -> torch_api.RendezvousInfo:
        """Join the next round, then open its agent store (hosted here when this node is rank 0).

        Raises:
            RendezvousClosedError: the rendezvous was closed for good.
            RendezvousTimeoutError: no round included this node within the join timeout.
            RendezvousConnectionError: etcd could not be reached, or the agent store could not be
                hosted or reached.
            RendezvousStateError: the state in etcd is corrupt.
        """
        self._round_store = None  # the old server stops once torch's agent drops its reference too
        self._restart_logged = False
        self._rejoin_seen = None
        try:
            with _torch_errors():
                info = self._handler.next_rendezvous()
        except torch_api.RendezvousError as error:
            self._leave_if_over(error.__cause__)
            raise
        self._joined = True
        raw = self._open_round_store(info)
        self._round_store = raw
        prefixed = dist.PrefixStore(f"torch.rendezvous.{info.run_id}.{info.round}", raw)
        store = AgentStore(prefixed, self._workers_succeeded, self._exit_barrier)
        return torch_api.RendezvousInfo(store, info.group_rank, info.group_world_size, self._bootstrap(info, store))

    def is_closed(self) -> bool:
        """Raises RendezvousConnectionError."""
        with _torch_errors():
            return self._handler.is_closed()

    def set_closed(self) -> None:
        """Close the rendezvous for every node. Raises RendezvousConnectionError."""
        with _torch_errors():
            self._handler.set_closed("closed by torchrun")

    def num_nodes_waiting(self) -> int:
        """Nodes waiting to join, or 1 when the round lost a member or was superseded or closed.

        torch's agent restarts its workers into a new round only when this is positive, so a
        member's departure (DESIGN §3.6) is reported as one waiting node: the survivors restart
        within the lease TTL instead of waiting for a collective to time out. torch then prints
        "Detected 1 new nodes", which is wrong for a loss or a deletion, so the real reason is
        logged once as a WARNING: torchrun configures handlers only for torch's own loggers, and
        Python's last-resort handler prints warnings of every other logger to stderr, INFO never.
        """
        status = self._handler.membership()
        if status.change is MembershipChange.JOB_FINISHED:
            return 0  # a peer finished the job: ours may finish; a failure ends the node at the next join
        if status.waiting > 0 and self._hide_rejoining(status.waiting, status.rejoining):
            return 0
        if status.waiting > 0:
            return status.waiting
        if status.change is None or status.change is MembershipChange.NODES_WAITING:
            return 0
        if not self._restart_logged:
            self._restart_logged = True
            log.warning("Rendezvous %s: node %s asks torchrun to restart its workers: %s",
                        self._handler.run_id, self._handler.node_id, status.reason)
        return 1

    def _hide_rejoining(self, waiting: int, rejoining: int) -> bool:
        """Whether to keep members that rejoined from torch's agent for :data:`REJOIN_GRACE_S`.

        A member rejoins when its workers failed; ours then fail too, on the collectives it
        broke, a moment later. torch's agent checks its workers first and counts a failure
        restart, but restarts through this waiting count without counting one: reporting the
        rejoin at once made two nodes of one attempt see TORCHELASTIC_RESTART_COUNT 1 and 0.
        After the grace the rejoin is reported anyway (our workers did not fail).
        """
        if rejoining < waiting:
            return False  # newcomers: a scale-up, report it now
        now = self._clock()
        if self._rejoin_seen is None:
            self._rejoin_seen = now
        return now - self._rejoin_seen < REJOIN_GRACE_S

    def get_run_id(self) -> str:
        return self._handler.run_id

    def shutdown(self) -> bool:
        """Leave the rendezvous without closing it for the others (DESIGN §3.7); False on failure.

        torch's ``launch_agent`` calls this from a ``finally`` on success and failure alike; on
        success (no exception passing through) the job's end is declared, if the exit barrier
        did not already (:mod:`elastic.rendezvous.torchrun_outcome`).
        """
        self._round_store = None
        if leaving_after_success():
            self._workers_succeeded()
        try:
            self._handler.shutdown()
            return True
        except Exception:  # noqa: BLE001 - torch calls this from a finally; never mask the real error
            log.warning("Rendezvous %s: node %s could not shut down cleanly",
                        self._handler.run_id, self._handler.node_id, exc_info=True)
            return False

    # -- the job's end and identity -----------------------------------------------------------------
    def _workers_succeeded(self) -> None:
        """This node's workers all succeeded: declare the job finished, once. Never raises (it
        runs inside torch's exit barrier and its ``finally``): a failure is logged."""
        if self._declared or not self._joined:
            return
        self._declared = True
        try:
            self._handler.declare_finished()
        except ours.RendezvousError as error:
            log.warning("Rendezvous %s: node %s could not record the job's end: %s", self._handler.run_id,
                        self._handler.node_id, error)

    def _exit_barrier(self, timeout: float) -> None:
        """Our exit barrier in place of torch's store counter (:mod:`elastic.rendezvous.torchrun_outcome`):
        over when every member is done or one left without being done. Never raises."""
        try:
            self._handler.finish(timeout)
        except ours.RendezvousError as error:
            log.warning("Rendezvous %s: node %s: the exit barrier failed (%s); the workers had finished",
                        self._handler.run_id, self._handler.node_id, error)

    def _leave_if_over(self, cause: BaseException | None) -> None:
        """End torchrun in one line when the job finished (exit 0, or 3 for a node that arrived
        after the end) or another job owns the run id (exit 1); see :func:`~elastic.rendezvous.torchrun_outcome.leaving_line` for why by
        ``SystemExit``. Returns for any other error (torch's agent handles it)."""
        leaving = leaving_line(cause, self._joined, self._already_finished_ok)
        if leaving is not None:
            line, code = leaving
            if code == 0:
                log.warning("Rendezvous %s: node %s: %s", self._handler.run_id, self._handler.node_id, line)
            else:
                log.error("%s", line)  # the refusal names the run and the node itself
            raise SystemExit(code)

    # -- helpers --------------------------------------------------------------------------------
    def _open_round_store(self, info: RendezvousInfo) -> dist.Store:
        """Host (rank 0) or join the round's TCPStore at ``master_addr:master_port``.

        Raises:
            RendezvousConnectionError: the port is taken, or the host did not answer in time.
        """
        is_master = info.group_rank == 0
        listener = info.master_listener
        listen_fd = listener.detach() if listener is not None else None
        try:
            return self._store_factory(info.master_addr, info.master_port, is_master, self._store_timeout, listen_fd)
        except (RuntimeError, OSError) as error:
            role = "host" if is_master else "reach"
            raise torch_api.RendezvousConnectionError(
                f"Rendezvous {info.run_id} round {info.round}: node {self._handler.node_id} cannot {role} the "
                f"agent store at {info.master_addr}:{info.master_port}: {error}"
            ) from error

    def _bootstrap(self, info: RendezvousInfo, store: dist.Store) -> torch_api.RendezvousStoreInfo:
        """Where workers meet: the agent store itself, or (sharing disabled) a port rank 0 publishes."""
        if self.use_agent_store:
            return torch_api.RendezvousStoreInfo(info.master_addr, info.master_port)
        try:
            return torch_api.RendezvousStoreInfo.build(info.group_rank, store, local_addr=self._node_addr)
        except RuntimeError as error:
            raise torch_api.RendezvousConnectionError(
                f"Rendezvous {info.run_id} round {info.round}: cannot exchange the workers' master address "
                f"through the agent store: {error}"
            ) from error


# -- entry point ------------------------------------------------------------------------------
def create_rdzv_handler(params: torch_api.RendezvousParameters) -> TorchrunRendezvousHandler:
    """Build the adapter for torchrun's parameters (connects to etcd at ``params.endpoint``).

    Raises:
        ValueError: no endpoint, an unknown ``--rdzv-conf`` option or a bad value.
        RendezvousConnectionError: etcd could not be reached or refused the credentials.
    """
    node_addr = params.local_addr or socket.getfqdn()
    with _torch_errors():
        for note in our_conf(params).notes:
            log.warning("Rendezvous %s: node %s: %s", params.run_id, node_addr, note)
        settings = settings_from_params(params)
        settings = dataclasses.replace(settings, job=torchrun_job(sys.argv, settings.job_fingerprint))
        spec = backend_from_params(params)
        _hide_secrets(conf_from_params(params))
        handler = create_handler(spec, settings, node_addr)
    log.info("Rendezvous %s: node %s (%s) uses etcd at %s through torchrun",
             settings.run_id, handler.node_id, node_addr, spec.endpoint_text)
    return TorchrunRendezvousHandler(handler, node_addr, store_timeout=_store_timeout(params, spec),
                                     already_finished_ok=settings.already_finished_ok)


def _hide_secrets(conf: dict[str, str]) -> None:
    """Keep an inline ``password=`` from torchrun's workers: torch's agent starts them with its
    own environment, so remove it from ``PET_RDZV_CONF`` there (the spec holds it already);
    warn once when it came from the command line, where ``ps`` shows it to every user."""
    given = inline_secret_options(conf)
    if not given:
        return
    try:
        from_env = inline_secret_options(parse_rdzv_conf(os.environ.get(RDZV_CONF_VARIABLE, "")))
    except ours.RendezvousConfigError:
        from_env = ()
    on_command_line = tuple(name for name in given if name not in from_env)
    if on_command_line:
        log.warning("%s", command_line_secret_warning(on_command_line))
    hide_inline_secrets(os.environ)


def handler_creator() -> Callable[[torch_api.RendezvousParameters], torch_api.RendezvousHandler]:
    """The ``torchrun.handlers`` entry point: torch calls it with no arguments for the creator.

    Always the same function, so registering twice (torch's registry refuses a different
    creator under one name) is harmless.
    """
    return create_rdzv_handler


def _store_timeout(params: torch_api.RendezvousParameters, spec: EtcdSpec) -> float:
    """``read_timeout`` or the default: torch's c10d store timeout is also our etcd request
    timeout, and wins over ``request_timeout``, so its parsed value is the spec's."""
    return spec.timeouts.request if "read_timeout" in conf_from_params(params) else DEFAULT_STORE_TIMEOUT
