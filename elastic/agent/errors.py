"""The agent's error tree: one base, :class:`AgentError`, whose message is one line for the user.

Foreign exceptions (``OSError`` from a spawn, a bind or a file, JSON errors) are translated at
the boundary with ``raise ... from``. The built-in mixins stay where callers catch by them:
``ValueError`` for bad input (a PID file's content, an event log path), ``OSError`` for the
lifeline's state directory, ``RuntimeError`` for the rest.
"""

from __future__ import annotations

__all__ = [
    "AgentError",
    "EventLogError",
    "LifelineError",
    "MetricsServerError",
    "PidFileError",
    "StoreHostError",
    "TemplateError",
    "WorkerStartError",
]


class AgentError(Exception):
    """Something the agent could not do; the message names what and why, in one line."""


class WorkerStartError(AgentError, RuntimeError):
    """A worker process could not be started (e.g. ``--no-python`` with a missing command)."""


class TemplateError(AgentError, RuntimeError):
    """A worker template cannot start a worker: it was refused, died, or did not answer. The
    agent then starts that worker the normal way."""


class StoreHostError(AgentError, RuntimeError):
    """The store helper could not start or could not serve the socket (the message says why)."""


class MetricsServerError(AgentError, RuntimeError):
    """The metrics server could not start; the message names the address and the cause."""


class PidFileError(AgentError, ValueError):
    """A PID file that cannot be trusted: not ours, not a regular file, too large, or bad content."""


class EventLogError(AgentError, ValueError):
    """The ``--event-log`` file cannot be opened for appending."""


class LifelineError(AgentError, OSError):
    """The PID-file directory cannot be used (not a directory of this user's), or this process
    cannot be identified."""
