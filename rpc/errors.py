"""The ``rpc/`` error tree. Errors from torch reach callers wrapped, with ``raise ... from``.

Exceptions raised by *user code* on a remote worker (a failing ``forward``) are not wrapped:
torch re-raises them on the caller with their type and the remote traceback in the message,
and :mod:`rpc.remote` keeps it that way.
"""

from __future__ import annotations


class RpcError(Exception):
    """Base of every error the ``rpc`` package raises."""


class RpcSetupError(RpcError):
    """RPC could not be set up for this worker; the message says what to fix."""


class WorkerEnvError(RpcSetupError, ValueError):
    """The worker environment is missing variables or is inconsistent; the message names them."""


class RpcOptionsError(RpcSetupError, ValueError):
    """An RPC option (timeout, thread count), from an argument or the environment, is invalid."""


class RpcInitError(RpcSetupError):
    """``init_rpc`` failed (store unreachable, peer missing, already started); names the worker."""


class RpcNotStartedError(RpcSetupError):
    """An operation needs RPC, but :func:`rpc.start` / :func:`rpc.init` has not run in this process."""


class RpcShutdownError(RpcError):
    """A graceful shutdown did not complete (a peer never reached it); RPC is down locally anyway."""


class WorkerLookupError(RpcError, LookupError):
    """No worker has the role (and role rank) asked for; the message lists the roles there are."""


class IntrospectionError(RpcError):
    """Distributed autograd state could not be read: no such context, or torch's private API changed."""


class CheckpointError(RpcError):
    """A checkpoint could not be written, found or applied; the message names the file and worker."""
