"""Send a state from one rank to others over the group, point to point; receive it.

Only the source and the receivers take part (a bystander survivor neither waits nor holds a
scratch copy), in this order on the wire, each a tensor:

1. a preamble ``int64[4]``: magic, wire version, header length, chunk count;
2. the header (``uint8``, :mod:`elastic.worker.codec`), at most ``max_header_bytes``;
3. the chunks, as the header lists them.

Any live rank can be the source (the highest mark wins), so a receiver bounds what one costs
it: the header's chunks together may take at most ``max_state_bytes`` (default: the memory
available on the wire device when the header arrives), and they are allocated as the data
arrives, at most two windows (:data:`WINDOW_BYTES`, :data:`WINDOW_CHUNKS`, or one larger
chunk each) ahead of it; an allocation that fails is a :class:`StateTransferError` too.

Every wait goes through the group's :class:`~elastic.worker.guard.OpRegistry`, so a source that
dies mid-transfer fails it (:class:`CollectiveFailed`) and a frozen one is abandoned when the
next round arrives; a receiver applies nothing until every chunk has arrived.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

import psutil
import torch
import torch.distributed as dist

from elastic.worker.codec import EncodedState, StateHeader, assemble, decode_header
from elastic.worker.errors import StateTransferError
from elastic.worker.guard import GuardedOp, OpRegistry

__all__ = ["WINDOW_BYTES", "WINDOW_CHUNKS", "Received", "available_bytes", "receive_state", "receive_windows",
           "send_state", "wire_device"]

MAGIC = 0x454C4153  # "ELAS"
WIRE_VERSION = 1
WINDOW_BYTES = 64 * 1024 * 1024
"""The chunk bytes one receive window allocates (a larger chunk is a window of its own)."""
WINDOW_CHUNKS = 1024
"""The most chunks one receive window posts."""


@dataclass(frozen=True)
class Received:
    state: Any
    nbytes: int


def send_state(registry: OpRegistry, group: dist.ProcessGroup, encoded: EncodedState, receivers: Sequence[int]) -> int:
    """Send ``encoded`` to every rank of ``receivers``; the bytes sent per receiver.

    Raises:
        GroupLost: a receiver failed or the group was abandoned meanwhile.
    """
    device = wire_device(group)
    header = torch.frombuffer(bytearray(encoded.header), dtype=torch.uint8).to(device)
    preamble = torch.tensor([MAGIC, WIRE_VERSION, len(encoded.header), len(encoded.chunks)], dtype=torch.int64, device=device)
    works = [
        dist.isend(tensor, rank, group=group)
        for rank in receivers
        for tensor in (preamble, header, *encoded.chunks)
    ]
    registry.launch(works).wait()
    return encoded.nbytes


def receive_state(registry: OpRegistry, group: dist.ProcessGroup, source: int, max_header_bytes: int,
                  max_state_bytes: int | None = None) -> Received:
    """Receive a state from rank ``source`` (a rank of ``group``); ``max_state_bytes`` bounds its
    chunks together (``None``: :func:`available_bytes` of the wire device).

    Raises:
        GroupLost: the source failed or the group was abandoned meanwhile.
        StateTransferError: the source sent a malformed or over-large header, or a chunk could
            not be allocated.
    """
    device = wire_device(group)
    preamble = torch.zeros(4, dtype=torch.int64, device=device)
    registry.launch([dist.irecv(preamble, source, group=group)]).wait()
    magic, version, header_len, chunk_count = (int(value) for value in preamble.tolist())
    if magic != MAGIC or version != WIRE_VERSION:
        raise StateTransferError(f"rank {source} sent a state of wire version {version} (magic {magic:#x}); this worker reads version {WIRE_VERSION}")
    if not 0 < header_len <= max_header_bytes:
        raise StateTransferError(f"rank {source} announced a {header_len}-byte state header; the limit is {max_header_bytes} bytes")
    header_bytes = bytearray(header_len)
    header_tensor = torch.frombuffer(header_bytes, dtype=torch.uint8)  # a view: receiving fills the bytearray
    wire_header = header_tensor if device.type == "cpu" else torch.empty(header_len, dtype=torch.uint8, device=device)
    registry.launch([dist.irecv(wire_header, source, group=group)]).wait()
    if wire_header is not header_tensor:
        header_tensor.copy_(wire_header)
    header = decode_header(bytes(header_bytes))
    if len(header.chunks) != chunk_count:
        raise StateTransferError(f"rank {source} announced {chunk_count} chunks but its header lists {len(header.chunks)}")
    _check_size(header, source, device, max_state_bytes)
    chunks = _receive_chunks(registry, group, source, header, device)
    nbytes = header_len + header.nbytes
    return Received(assemble(header, chunks), nbytes)


def _check_size(header: StateHeader, source: int, device: torch.device, max_state_bytes: int | None) -> None:
    if max_state_bytes is not None:
        if header.nbytes > max_state_bytes:
            raise StateTransferError(f"rank {source} announced a state of {header.nbytes} bytes; the limit is "
                                     f"{max_state_bytes} bytes (LiveOptions.max_state_bytes)")
        return
    available = available_bytes(device)
    if header.nbytes > available:
        raise StateTransferError(f"rank {source} announced a state of {header.nbytes} bytes; {device} has "
                                 f"{available} bytes available (LiveOptions.max_state_bytes sets a limit)")


def _receive_chunks(registry: OpRegistry, group: dist.ProcessGroup, source: int, header: StateHeader,
                    device: torch.device) -> list[torch.Tensor]:
    """The chunks of ``header``, each window allocated only once the one two before it arrived."""
    chunks: list[torch.Tensor] = []
    in_flight: deque[GuardedOp] = deque()
    for window in receive_windows([numel * dtype.itemsize for dtype, numel in header.chunks]):
        received = [_allocate(*header.chunks[index], device, source) for index in window]
        chunks.extend(received)
        in_flight.append(registry.launch([dist.irecv(chunk, source, group=group) for chunk in received]))
        if len(in_flight) == 2:
            in_flight.popleft().wait()
    while in_flight:
        in_flight.popleft().wait()
    return chunks


def receive_windows(sizes: Sequence[int], window_bytes: int = WINDOW_BYTES,
                    window_chunks: int = WINDOW_CHUNKS) -> list[range]:
    """Consecutive chunks (their byte ``sizes``) cut into windows of at most ``window_bytes``
    and ``window_chunks`` each, a larger chunk alone in its window. Pure."""
    windows, start, size = [], 0, 0
    for index, nbytes in enumerate(sizes):
        if index > start and (size + nbytes > window_bytes or index - start >= window_chunks):
            windows.append(range(start, index))
            start, size = index, 0
        size += nbytes
    if start < len(sizes):
        windows.append(range(start, len(sizes)))
    return windows


def _allocate(dtype: torch.dtype, numel: int, device: torch.device, source: int) -> torch.Tensor:
    try:
        return torch.empty(numel, dtype=dtype, device=device)
    except (RuntimeError, MemoryError, OverflowError, TypeError) as error:  # torch.OutOfMemoryError is a RuntimeError
        raise StateTransferError(f"rank {source}'s state: cannot allocate a chunk of {numel} {dtype} on {device} "
                                 f"({(str(error).splitlines() or [type(error).__name__])[0][:200]})") from error


def available_bytes(device: torch.device) -> int:
    """The memory available for a received state: free memory on a CUDA device, else the
    system's available memory (as ``psutil`` reports it)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return psutil.virtual_memory().available


def wire_device(group: dist.ProcessGroup) -> torch.device:
    """Where the wire tensors live: the current CUDA device for NCCL, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
