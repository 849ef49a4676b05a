"""Start and stop ``torch.distributed.rpc`` from the worker environment, once per attempt.

    import rpc

    with rpc.start() as session:          # init_rpc as f"{ROLE_NAME}{ROLE_RANK}", rank RANK
        ...                               # rpc_sync / remote / distributed autograd
    # graceful shutdown here (waits for every worker); non-graceful if the body raised

:func:`start` (a context manager) and :func:`init` / :func:`shutdown` read ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, the role variables and the restart count
(:mod:`rpc.env`), open the attempt's store through an ``elastic-rpc://`` init method
(:mod:`rpc.rendezvous`: a fresh server per attempt, keys prefixed with run id and restart
count), and call ``init_rpc``. Timeouts, the thread count and the TensorPipe transports come
from arguments, else ``ELASTIC_RPC_*`` variables, else defaults (:class:`rpc.env.RpcOptions`;
the transport defaults to ``uv``, since torch's shared-memory one busy-polls a core per worker).

Teardown never hangs the agent's restart:

* a body that raises shuts down without waiting for the other workers (they may be dead);
* a graceful shutdown waits for the other workers, at most ``shutdown_timeout`` if set (by
  default as long as they work: a parameter server waits for its trainers);
* SIGTERM (the agent stopping the group) shuts down locally within ``sigterm_timeout`` and
  exits with 143, even while the main thread waits in an RPC (:mod:`rpc.signals`);
* at interpreter exit a session still open is shut down: gracefully after a normal exit, not
  after an uncaught exception.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import logging
import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Iterator, Mapping

from rpc import rendezvous
from rpc.env import RpcOptions, RpcWorkerEnv
from rpc.errors import RpcError, RpcInitError, RpcNotStartedError, RpcShutdownError
from rpc.signals import SigtermGuard

log = logging.getLogger(__name__)

__all__ = ["RpcSession", "current", "init", "is_started", "shutdown", "start"]


@dataclass(frozen=True)
class RpcSession:
    """The RPC membership of this process for one attempt."""

    env: RpcWorkerEnv
    options: RpcOptions
    init_method: str

    @property
    def name(self) -> str:
        return self.env.name

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    def describe(self) -> str:
        return f"run {self.env.run_id} worker {self.name}"


_lock = threading.RLock()
_terminating = threading.Event()  # set by the SIGTERM path before it stops the local agent
_session: RpcSession | None = None
_guard: SigtermGuard | None = None
_atexit_registered = False


def init(
    *,
    environ: Mapping[str, str] | None = None,
    env: RpcWorkerEnv | None = None,
    handle_sigterm: bool = True,
    rpc_timeout: float | None = None,
    init_timeout: float | None = None,
    num_worker_threads: int | None = None,
    shutdown_timeout: float | None = None,
    sigterm_timeout: float | None = None,
    transports: str | tuple[str, ...] | None = None,
) -> RpcSession:
    """Join this attempt's RPC group; returns when every worker has joined.

    Args:
        environ: where to read the worker environment and ``ELASTIC_RPC_*`` (default ``os.environ``).
        env: an already parsed identity (overrides ``environ`` for it).
        handle_sigterm: install the SIGTERM handler (main thread only).
        rpc_timeout, init_timeout, num_worker_threads, shutdown_timeout, sigterm_timeout, transports:
            see :class:`rpc.env.RpcOptions`; ``None`` takes the environment's or the default.

    Raises:
        WorkerEnvError: the environment is missing variables or is inconsistent.
        RpcOptionsError: an option is invalid.
        RpcInitError: RPC is already started here, numpy or torch.distributed.rpc is missing, or
            ``init_rpc`` failed (the store or a peer was not reached in time).
    """
    global _session, _guard
    environ = os.environ if environ is None else environ
    env = env if env is not None else RpcWorkerEnv.from_environ(environ)
    options = RpcOptions.resolve(
        environ, rpc_timeout=rpc_timeout, init_timeout=init_timeout, num_worker_threads=num_worker_threads,
        shutdown_timeout=shutdown_timeout, sigterm_timeout=sigterm_timeout, transports=transports,
    )  # fmt: skip
    with _lock:
        if _session is not None:
            raise RpcInitError(f"RPC is already started in this process as {_session.name}; shut it down first.")
        trpc = _torch_rpc()
        rendezvous.register()
        url = rendezvous.init_method(env, options.init_timeout)
        session = RpcSession(env, options, url)
        log.info("Run %s: starting RPC as %s (rank %d of %d, restart %d) via %s",
                 env.run_id, env.name, env.rank, env.world_size, env.restart_count, url)
        backend_options = _backend_options(trpc, options, url)
        try:
            with warnings.catch_warnings():
                # torch's TensorPipe setup calls a deprecated process-group API of its own.
                warnings.filterwarnings("ignore", message="You are using a Backend .* as a ProcessGroup")
                trpc.init_rpc(env.name, rank=env.rank, world_size=env.world_size, rpc_backend_options=backend_options)
        except Exception as error:
            _teardown_after_failed_init(trpc)
            raise RpcInitError(
                f"Worker {env.name} (rank {env.rank} of {env.world_size}, run {env.run_id}, restart "
                f"{env.restart_count}) could not join the RPC group through {env.master_addr}:{env.master_port}: "
                f"{_first_line(error)}"
            ) from error
        _session = session
        if handle_sigterm:
            _guard = SigtermGuard(_shutdown_locally, options.sigterm_timeout, describe=session.describe())
            _guard.install()
        _register_atexit()
        log.info("Run %s: RPC is up as %s", env.run_id, env.name)
        return session


def shutdown(graceful: bool = True, timeout: float | None = None) -> None:
    """Leave the RPC group; a no-op when RPC is not started by us.

    Args:
        graceful: wait for every worker to reach its shutdown and for outstanding work (at most
            ``timeout`` seconds, default the session's ``shutdown_timeout``; 0: no limit);
            ``False``: stop locally now.

    Raises:
        RpcShutdownError: a graceful shutdown did not complete (a peer never reached it). RPC is
            down in this process anyway and can be started again.
    """
    global _session, _guard
    _park_if_terminating()
    with _lock:
        session = _session
        if session is None:
            return
        guard, _guard = _guard, None
        wait = session.options.shutdown_timeout if timeout is None else timeout
        trpc = _torch_rpc()
        try:
            trpc.shutdown(graceful=graceful, timeout=wait)
        except Exception as error:
            if graceful:
                limit = f"within {wait:g}s" if wait else "(no time limit)"
                raise RpcShutdownError(
                    f"{session.describe()}: the graceful RPC shutdown did not complete {limit} "
                    f"({_first_line(error)}); RPC is down locally."
                ) from error
            log.warning("%s: the local RPC shutdown failed: %s", session.describe(), _first_line(error))
        finally:
            _session = None
            if guard is not None:
                guard.uninstall()
        log.info("%s: RPC shut down (%s)", session.describe(), "graceful" if graceful else "local")


@contextlib.contextmanager
def start(**kwargs) -> Iterator[RpcSession]:
    """:func:`init`, then :func:`shutdown` on exit: graceful normally, local if the body raised.

    ``sys.exit(0)`` in the body counts as a normal exit. Takes :func:`init`'s keyword arguments
    and raises what it raises; a graceful shutdown that fails raises
    :class:`~rpc.errors.RpcShutdownError` (a body's own exception wins over it).
    """
    session = init(**kwargs)
    try:
        yield session
    except SystemExit as exiting:
        _shutdown_after_body(session, graceful=exiting.code in (0, None))
        raise
    except BaseException:
        _shutdown_after_body(session, graceful=False)
        raise
    shutdown(graceful=True)


def _shutdown_after_body(session: RpcSession, graceful: bool) -> None:
    try:
        shutdown(graceful=graceful)
    except RpcError as error:  # the body's exception (or exit) is the one to report
        log.warning("%s: %s", session.describe(), error)


def current() -> RpcSession:
    """The running session. Raises RpcNotStartedError when RPC is not started."""
    session = _session
    if session is None:
        raise RpcNotStartedError("RPC is not started in this process: call rpc.start() (or rpc.init()) first.")
    return session


def is_started() -> bool:
    return _session is not None


# -- internals ---------------------------------------------------------------------------------


def _torch_rpc():
    """``torch.distributed.rpc``, checked usable. Raises RpcInitError."""
    if importlib.util.find_spec("numpy") is None:
        raise RpcInitError(
            "torch.distributed.rpc needs numpy at run time and torch does not install it: "
            "pip install 'etcd-elastic[rpc]' (or numpy)."
        )
    import torch.distributed.rpc as trpc

    if not trpc.is_available():
        raise RpcInitError("This torch build has no torch.distributed.rpc (built without distributed support).")
    return trpc


def _backend_options(trpc, options: RpcOptions, url: str):
    """TensorPipe options; ``_transports`` is torch's (underscored) knob for the transports."""
    extra = {} if options.transports is None else {"_transports": list(options.transports)}
    try:
        return trpc.TensorPipeRpcBackendOptions(
            num_worker_threads=options.num_worker_threads, rpc_timeout=options.rpc_timeout, init_method=url, **extra
        )
    except TypeError as error:
        raise RpcInitError(
            f"This torch's TensorPipeRpcBackendOptions does not take _transports ({error}); "
            "set ELASTIC_RPC_TRANSPORTS=auto."
        ) from error


def _first_line(error: BaseException) -> str:
    """The gist of a torch error (its C++ ones append a native stack trace; the cause keeps it)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _teardown_after_failed_init(trpc) -> None:
    """Undo a half-finished ``init_rpc`` so a retry in this process is possible."""
    is_set = getattr(trpc, "_is_current_rpc_agent_set", None)
    try:
        if is_set is not None and is_set():
            trpc.shutdown(graceful=False)
    except Exception as error:  # already failing; the init error is the one to report
        log.debug("local shutdown after a failed init_rpc: %s", error)


def _shutdown_locally() -> None:
    """SIGTERM path: stop the local agent without waiting for anyone (never takes ``_lock``).

    Stopping the agent fails the main thread's pending RPCs; ``_terminating`` makes the main
    thread park in :func:`shutdown` instead of racing this thread to exit with another code.
    """
    _terminating.set()
    if _session is None:
        return
    import torch.distributed.rpc as trpc

    is_set = getattr(trpc, "_is_current_rpc_agent_set", None)
    if is_set is not None and not is_set():
        return  # the main thread's own (failed-RPC) teardown got there first
    trpc.shutdown(graceful=False)


def _park_if_terminating() -> None:
    """On the SIGTERM path the watcher thread exits the process (143) within its bound: wait for it."""
    if not _terminating.is_set():
        return
    session = _session
    bound = (session.options.sigterm_timeout if session is not None else 5.0) + 10.0
    time.sleep(bound)
    log.warning("SIGTERM was received but the process did not exit within %.1fs; continuing the shutdown", bound)


def _register_atexit() -> None:
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_shutdown_at_exit)
        _atexit_registered = True


def _shutdown_at_exit() -> None:
    """A session left open at interpreter exit: graceful after a normal exit, local after a crash."""
    session = _session
    if session is None:
        return
    crashed = getattr(sys, "last_value", None) is not None or getattr(sys, "last_exc", None) is not None
    try:
        shutdown(graceful=not crashed)
    except RpcError as error:
        log.warning("%s: at exit: %s", session.describe(), error)
