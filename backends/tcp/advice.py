"""What to do when a store cannot be reached: the advice in a connection error's one line (pure)."""

from __future__ import annotations

import socket


def dial_advice(error: OSError, timeout: float) -> str:
    """Why a TCP connection to a store failed and what to do, from the OS error (pure)."""
    if isinstance(error, socket.gaierror):
        return (f"the host name does not resolve ({error.strerror or error}); fix --rdzv-endpoint, or add the name "
                "to DNS or /etc/hosts")
    if isinstance(error, ConnectionRefusedError):
        return ("nothing listens there (connection refused); start the store (elastic-store, or the node whose "
                "address is a c10d endpoint) first, or fix --rdzv-endpoint")
    if isinstance(error, TimeoutError):
        return (f"it did not answer within {timeout:g}s; check that the host is up and that no firewall drops "
                "the port")
    return f"{error.strerror or error}"
