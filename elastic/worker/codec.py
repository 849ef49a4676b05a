"""A ``state_dict()`` as a JSON header plus flat tensor chunks, and back. Never pickle.

The header keeps the structure (dicts with their key types and order, lists, tuples, numbers,
strings, ``None``, a module state dict's ``_metadata``) with each tensor replaced by its index;
the tensors travel as chunks: a tensor of ``coalesce_bytes`` or more alone (received straight
into its own buffer), smaller ones of one dtype packed together (cloned out on arrival).

Header (``{"v": 1, ...}``)::

    skeleton   the structure; a tensor is {"$tensor": i}, a tuple {"$tuple": [...]}, a dict
               {"$dict": [[key, value], ...]} (with "$meta" for an OrderedDict's _metadata)
    chunks     [[dtype, numel], ...] in sending order
    tensors    [[chunk, offset, shape], ...] indexed by i

A received header is validated before anything is allocated, in time linear in its size:
version, dtypes from a fixed list, chunk sizes (at most one empty chunk per dtype, as the
encoder makes), shapes (at most :data:`MAX_DIMS` dimensions, each below 2**63), tensors inside
their chunk and not overlapping one another (so the tensors cloned out of a packed chunk never
take more than the chunk), every tensor index in range. What the whole state may take is the
receiver's policy (:mod:`elastic.worker.transfer`), from :attr:`StateHeader.nbytes`.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from elastic.worker.errors import StateTransferError

__all__ = ["EncodedState", "StateHeader", "assemble", "check_state", "decode_header", "encode_state"]

HEADER_VERSION = 1
MAX_DEPTH = 64
MAX_DIMS = 64
"""The most dimensions a tensor may have to be sent (far more than any real state uses)."""
_MAX_SIZE = 2**63 - 1
"""The largest chunk length, offset or dimension: what an ``int64`` holds."""

_DTYPES = {
    name: getattr(torch, name)
    for name in (
        "float64", "float32", "float16", "bfloat16", "complex64", "complex128",
        "int64", "int32", "int16", "int8", "uint8", "bool",
    )
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


@dataclass(frozen=True)
class EncodedState:
    """What a source sends: the header bytes and the chunks, in order."""

    header: bytes
    chunks: tuple[torch.Tensor, ...]

    @property
    def nbytes(self) -> int:
        return len(self.header) + sum(chunk.numel() * chunk.element_size() for chunk in self.chunks)


@dataclass(frozen=True)
class StateHeader:
    """A validated header: what to allocate, and how to rebuild the state from the chunks."""

    skeleton: Any
    chunks: tuple[tuple[torch.dtype, int], ...]
    tensors: tuple[tuple[int, int, tuple[int, ...]], ...]

    @property
    def nbytes(self) -> int:
        """The bytes of all chunks: what receiving them allocates."""
        return sum(numel * dtype.itemsize for dtype, numel in self.chunks)


class _Encoder:
    def __init__(self, device: torch.device | None) -> None:
        self.device = device
        self.tensors: list[torch.Tensor] = []

    def encode(self, value: Any, path: str, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise StateTransferError(f"state_dict() is nested deeper than {MAX_DEPTH} levels at {path}.")
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {"$float": repr(value)}
        if isinstance(value, torch.Tensor):
            return {"$tensor": self._tensor(value, path)}
        if isinstance(value, list):
            return [self.encode(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
        if isinstance(value, tuple):
            return {"$tuple": [self.encode(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]}
        if isinstance(value, dict):
            encoded: dict[str, Any] = {"$dict": [
                [self.encode(key, f"{path} key {key!r}", depth + 1), self.encode(item, f"{path}[{key!r}]", depth + 1)]
                for key, item in value.items()
            ]}
            metadata = getattr(value, "_metadata", None)
            if isinstance(value, OrderedDict) and metadata is not None:
                encoded["$meta"] = self.encode(dict(metadata), f"{path}._metadata", depth + 1)
            return encoded
        raise StateTransferError(
            f"state_dict() holds a {type(value).__name__} at {path}; it may hold tensors, numbers, "
            "strings, None, lists, tuples and dicts only (nothing is pickled)."
        )

    def _tensor(self, tensor: torch.Tensor, path: str) -> int:
        if (type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.layout != torch.strided
                or tensor.is_quantized or tensor.is_nested):
            raise StateTransferError(f"state_dict() holds a {type(tensor).__name__} ({tensor.layout}) at {path}; only dense tensors can be sent.")
        if tensor.dtype not in _NAMES:
            raise StateTransferError(f"state_dict() holds a {tensor.dtype} tensor at {path}; the supported dtypes are {', '.join(_DTYPES)}.")
        if tensor.dim() > MAX_DIMS:
            raise StateTransferError(f"state_dict() holds a tensor of {tensor.dim()} dimensions at {path}; at most {MAX_DIMS} can be sent.")
        tensor = tensor.detach()
        if self.device is not None and tensor.device != self.device:
            tensor = tensor.to(self.device)
        self.tensors.append(tensor.contiguous())
        return len(self.tensors) - 1


def check_state(state: Any) -> int:
    """Check that ``state`` can be sent, without copying a tensor; the number of tensors in it.

    Raises:
        StateTransferError: ``state`` holds a value that cannot be sent; the message names where.
    """
    encoder = _Encoder(None)
    encoder.encode(state, "state_dict()", 0)
    return len(encoder.tensors)


def encode_state(state: Any, coalesce_bytes: int, device: torch.device | None = None) -> EncodedState:
    """Encode ``state`` for sending, its tensors on ``device`` (``None``: where they are).

    Raises:
        StateTransferError: ``state`` holds a value that cannot be sent; the message names where.
    """
    encoder = _Encoder(device)
    skeleton = encoder.encode(state, "state_dict()", 0)
    chunks: list[torch.Tensor] = []
    chunk_specs: list[list[Any]] = []
    tensor_specs: list[list[Any]] = []
    packs: dict[torch.dtype, tuple[int, list[torch.Tensor], int]] = {}  # dtype -> (chunk index, members, numel)

    def flush(dtype: torch.dtype) -> None:
        index, members, _ = packs.pop(dtype)
        chunks[index] = torch.cat([member.reshape(-1) for member in members]) if members else chunks[index]

    for tensor in encoder.tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes >= coalesce_bytes:
            tensor_specs.append([len(chunks), 0, list(tensor.shape)])
            chunk_specs.append([_NAMES[tensor.dtype], tensor.numel()])
            chunks.append(tensor.reshape(-1))
            continue
        pack = packs.get(tensor.dtype)
        if pack is not None and (pack[2] + tensor.numel()) * tensor.element_size() > coalesce_bytes:
            flush(tensor.dtype)
            pack = None
        if pack is None:
            pack = (len(chunks), [], 0)
            chunks.append(tensor)  # replaced by the packed chunk at flush
            chunk_specs.append([_NAMES[tensor.dtype], 0])
        index, members, numel = pack
        tensor_specs.append([index, numel, list(tensor.shape)])
        members.append(tensor)
        chunk_specs[index][1] = numel + tensor.numel()
        packs[tensor.dtype] = (index, members, numel + tensor.numel())
    for dtype in list(packs):
        flush(dtype)
    header = {"v": HEADER_VERSION, "skeleton": skeleton, "chunks": chunk_specs, "tensors": tensor_specs}
    return EncodedState(json.dumps(header, separators=(",", ":")).encode(), tuple(chunks))


def decode_header(data: bytes) -> StateHeader:
    """Parse and validate a received header (see the module docstring for what is checked).

    Raises:
        StateTransferError: the header is not JSON, of another version, or inconsistent.
    """
    try:
        header = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise StateTransferError(f"the state header is not UTF-8 JSON: {error}") from error
    if not isinstance(header, dict) or header.get("v") != HEADER_VERSION:
        raise StateTransferError(f"the state header is not version {HEADER_VERSION}")
    chunks = _chunks(_list(header.get("chunks"), "chunks"))
    tensors = [_tensor_spec(spec, chunks) for spec in _list(header.get("tensors"), "tensors")]
    _check_disjoint(tensors)
    return StateHeader(header.get("skeleton"), tuple(chunks), tuple(tensors))


def _chunks(specs: list) -> list[tuple[torch.dtype, int]]:
    chunks, empty = [], 0
    for spec in specs:
        if not (isinstance(spec, list) and len(spec) == 2 and spec[0] in _DTYPES and _count(spec[1])):
            raise StateTransferError(f"the state header has a bad chunk {spec!r:.100}")
        if spec[1] == 0:
            empty += 1
            if empty > len(_DTYPES):
                raise StateTransferError(f"the state header has more than {len(_DTYPES)} empty chunks (one per dtype at most)")
        chunks.append((_DTYPES[spec[0]], spec[1]))
    return chunks


def _tensor_spec(spec: Any, chunks: list[tuple[torch.dtype, int]]) -> tuple[int, int, tuple[int, ...]]:
    if not (isinstance(spec, list) and len(spec) == 3 and _count(spec[0]) and spec[0] < len(chunks)
            and _count(spec[1]) and isinstance(spec[2], list)):
        raise StateTransferError(f"the state header has a bad tensor {spec!r:.100}")
    chunk, offset, shape = spec
    if len(shape) > MAX_DIMS or not all(_count(size) for size in shape):
        raise StateTransferError(f"the state header has a bad shape (at most {MAX_DIMS} sizes below 2**63) {shape!r:.100}")
    if offset + math.prod(shape) > chunks[chunk][1]:
        raise StateTransferError(f"the state header has a tensor past the end of chunk {chunk}")
    return chunk, offset, tuple(shape)


def _check_disjoint(tensors: list[tuple[int, int, tuple[int, ...]]]) -> None:
    """Refuse tensors whose ranges overlap in a chunk (each would be cloned apart)."""
    ranges = sorted((chunk, offset, offset + math.prod(shape)) for chunk, offset, shape in tensors if math.prod(shape))
    for (chunk, _, end), (next_chunk, start, _) in zip(ranges, ranges[1:]):
        if chunk == next_chunk and start < end:
            raise StateTransferError(f"the state header has tensors that overlap in chunk {chunk} at element {start}")


def _list(value: Any, name: str) -> list:
    if not isinstance(value, list):
        raise StateTransferError(f"the state header's {name} is not a list")
    return value


def _count(value: Any) -> bool:
    """A length, offset or size: an ``int`` (not a bool) from 0 to 2**63 - 1."""
    return type(value) is int and 0 <= value <= _MAX_SIZE


def assemble(header: StateHeader, chunks: list[torch.Tensor]) -> Any:
    """The state described by ``header``, its tensors taken from the received ``chunks``.

    Raises:
        StateTransferError: the skeleton is malformed (an unknown tag, a tensor index out of range).
    """
    tensors = []
    for chunk, offset, shape in header.tensors:
        flat = chunks[chunk]
        if offset == 0 and math.prod(shape) == flat.numel():
            tensors.append(flat.view(shape))
        else:
            tensors.append(flat[offset:offset + math.prod(shape)].view(shape).clone())
    try:
        return _decode(header.skeleton, tensors, 0)
    except RecursionError as error:
        raise StateTransferError("the state header is nested too deeply") from error


def _decode(value: Any, tensors: list[torch.Tensor], depth: int) -> Any:
    if depth > MAX_DEPTH + 2:
        raise StateTransferError(f"the state header is nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_decode(item, tensors, depth + 1) for item in value]
    if not isinstance(value, dict) or len(set(value) - {"$meta"}) != 1:
        raise StateTransferError(f"the state header has an unknown value {value!r:.100}")
    if "$tensor" in value:
        index = value["$tensor"]
        if not _count(index) or index >= len(tensors):
            raise StateTransferError(f"the state header names tensor {index!r:.20} of {len(tensors)}")
        return tensors[index]
    if "$float" in value and value["$float"] in ("nan", "inf", "-inf"):
        return float(value["$float"])
    if "$tuple" in value and isinstance(value["$tuple"], list):
        return tuple(_decode(item, tensors, depth + 1) for item in value["$tuple"])
    if "$dict" in value and isinstance(value["$dict"], list):
        out: dict = OrderedDict() if "$meta" in value else {}
        for pair in value["$dict"]:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise StateTransferError(f"the state header has a bad dict entry {pair!r:.100}")
            key = _decode(pair[0], tensors, depth + 1)
            try:
                out[key] = _decode(pair[1], tensors, depth + 1)
            except TypeError as error:
                raise StateTransferError(f"the state header has an unhashable key {key!r:.100}") from error
        if "$meta" in value:
            out._metadata = _decode(value["$meta"], tensors, depth + 1)  # type: ignore[attr-defined]
        return out
    raise StateTransferError(f"the state header has an unknown value {value!r:.100}")
