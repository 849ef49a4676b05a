"""How a receiver allocates a state's chunks: in windows, at most two ahead of the data (unit
tests; the real gloo pair is in tests/security/test_heal_bounds.py)."""

from __future__ import annotations

import pytest
import torch

from elastic.worker import transfer
from elastic.worker.codec import StateHeader
from elastic.worker.errors import StateTransferError
from elastic.worker.transfer import receive_windows


@pytest.mark.parametrize(
    ("sizes", "window_bytes", "window_chunks", "windows"),
    [
        ([], 30, 10, []),
        ([10] * 5, 30, 10, [range(0, 3), range(3, 5)]),
        ([100], 30, 10, [range(0, 1)]),  # a chunk larger than a window is a window of its own
        ([5, 100, 5, 5], 30, 10, [range(0, 1), range(1, 2), range(2, 4)]),
        ([1] * 5, 30, 2, [range(0, 2), range(2, 4), range(4, 5)]),
        ([0, 0, 30, 0], 30, 10, [range(0, 4)]),
    ],
)
def test_chunks_are_cut_into_windows_of_bounded_bytes_and_count(sizes, window_bytes, window_chunks, windows):
    assert receive_windows(sizes, window_bytes, window_chunks) == windows


class _Op:
    def __init__(self, events: list, number: int) -> None:
        self.events, self.number = events, number

    def wait(self) -> None:
        self.events.append(("arrived", self.number))


class _Registry:
    def __init__(self, events: list) -> None:
        self.events, self.launched = events, 0

    def launch(self, works):
        self.launched += 1
        return _Op(self.events, self.launched - 1)


def test_a_window_is_allocated_only_once_the_one_two_before_it_arrived(monkeypatch):
    events: list = []
    monkeypatch.setattr(transfer.dist, "irecv", lambda tensor, source, group: None)
    allocate = transfer._allocate
    monkeypatch.setattr(transfer, "_allocate", lambda *args: events.append("allocate") or allocate(*args))
    header = StateHeader(None, ((torch.float32, 4),) * 7, ())
    monkeypatch.setattr(transfer, "receive_windows", lambda sizes: receive_windows(sizes, 1 << 20, 2))
    chunks = transfer._receive_chunks(_Registry(events), None, 0, header, torch.device("cpu"))
    assert len(chunks) == 7
    assert events == ["allocate"] * 4 + [("arrived", 0)] + ["allocate"] * 2 + [("arrived", 1)] + ["allocate"] + [
        ("arrived", 2), ("arrived", 3)]


def test_a_chunk_that_cannot_be_allocated_is_a_state_transfer_error():
    with pytest.raises(StateTransferError, match=r"rank 3's state: cannot allocate a chunk of 1125899906842624 torch.float32"):
        transfer._allocate(torch.float32, 2**50, torch.device("cpu"), 3)
