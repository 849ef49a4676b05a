"""The rendezvous error tree. Backend errors reach callers wrapped, with ``raise ... from``."""

from __future__ import annotations


class RendezvousError(Exception):
    """Base of every error the rendezvous engine raises."""


class RendezvousConfigError(RendezvousError, ValueError):
    """A setting or ``--rdzv-conf`` option is invalid; the message names it and the valid forms."""


class RendezvousStateError(RendezvousError):
    """State read from the store is corrupt or of an unknown version; the message names the key."""


class RendezvousClosedError(RendezvousError):
    """The rendezvous was closed (the job finished or failed for good); no new round will form."""


class RendezvousTimeoutError(RendezvousError):
    """A round did not include this node before the join timeout."""


class RendezvousConnectionError(RendezvousError):
    """The backend could not be reached; the message names the endpoint and the cause."""


class RendezvousSessionLostError(RendezvousError):
    """This node's lease was lost (it was silent for longer than the lease TTL)."""
