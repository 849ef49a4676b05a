"""How long a TorchFT heal's fetch from a peer takes, for the TorchFT benchmark workers
(``torchft_train.py``, ``hsdp_torchft_train.py``): :func:`timed_fetches` wraps a checkpoint
transport's ``recv_checkpoint`` and appends each call's seconds to :data:`fetches`."""

from __future__ import annotations

import time

fetches: list[float] = []
"""Seconds of each ``recv_checkpoint``, appended on TorchFT's quorum thread."""


def timed_fetches(transport) -> None:
    """Time ``transport.recv_checkpoint`` (the heal's fetch from a peer) into :data:`fetches`."""
    recv = transport.recv_checkpoint

    def recv_checkpoint(*args, **kwargs):
        began = time.monotonic()
        try:
            return recv(*args, **kwargs)
        finally:
            fetches.append(time.monotonic() - began)

    transport.recv_checkpoint = recv_checkpoint
