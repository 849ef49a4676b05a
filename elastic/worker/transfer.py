"""Send a state from one rank to others over the group, point to point; receive it.

Only the source and the receivers take part (a bystander survivor neither waits nor holds a
scratch copy), in this order on the wire, each a tensor:

1. a preamble ``int64[4]``: magic, wire version, header length, chunk count;
2. the header (``uint8``, :mod:`elastic.worker.codec`), at most ``max_header_bytes``;
3. the chunks, as the header lists them.

Every wait goes through the group's :class:`~elastic.worker.guard.OpRegistry`, so a source that
dies mid-transfer fails it (:class:`CollectiveFailed`) and a frozen one is abandoned when the
next round arrives; a receiver applies nothing until every chunk has arrived.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist

from elastic.worker.codec import EncodedState, assemble, decode_header
from elastic.worker.errors import StateTransferError
from elastic.worker.guard import OpRegistry

__all__ = ["Received", "receive_state", "send_state", "wire_device"]

MAGIC = 0x454C4153  # "ELAS"
WIRE_VERSION = 1


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


def receive_state(registry: OpRegistry, group: dist.ProcessGroup, source: int, max_header_bytes: int) -> Received:
    """Receive a state from rank ``source`` (a rank of ``group``).

    Raises:
        GroupLost: the source failed or the group was abandoned meanwhile.
        StateTransferError: the source sent a malformed or over-large header.
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
    chunks = [torch.empty(numel, dtype=dtype, device=device) for dtype, numel in header.chunks]
    if chunks:
        registry.launch([dist.irecv(chunk, source, group=group) for chunk in chunks]).wait()
    nbytes = header_len + sum(chunk.numel() * chunk.element_size() for chunk in chunks)
    return Received(assemble(header, chunks), nbytes)


def wire_device(group: dist.ProcessGroup) -> torch.device:
    """Where the wire tensors live: the current CUDA device for NCCL, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
