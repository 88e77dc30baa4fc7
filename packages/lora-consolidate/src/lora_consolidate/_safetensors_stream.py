"""A streaming safetensors writer (header first, then one tensor at a time) and header reader.

``safetensors.torch.save_file`` needs every tensor in memory at once. All shapes and dtypes are
known from shard metadata before any data is read, so the header can be written up front and each
tensor appended as soon as it has been assembled, then dropped.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from lora_consolidate._writer import ChunkedWriter
from lora_consolidate.errors import ShardError

_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
DTYPES_BY_NAME: dict[str, torch.dtype] = {name: dtype for dtype, name in _DTYPES.items()}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Name, global shape and dtype of one output tensor."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        numel = 1
        for dim in self.shape:
            numel *= dim
        return numel * self.dtype.itemsize


def safetensors_dtype(dtype: torch.dtype) -> str:
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype} has no safetensors encoding") from None


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """Raw little-endian bytes of a CPU tensor without a copy when it is already contiguous."""
    flat = tensor.detach().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())


def iter_header(
    specs: Collection[TensorSpec], metadata: Mapping[str, str] | None = None
) -> Iterator[bytes]:
    """The safetensors prefix for ``specs`` laid out in order, in pieces (one per tensor).

    The same bytes as ``json.dumps`` of the whole header dict, without building it: the header
    of a file with thousands of tensors never has to be held as Python objects. ``specs`` is
    iterated twice (lengths first).

    Raises:
        ValueError: A dtype has no safetensors encoding.
    """
    total = 2 + (len(meta_piece(metadata)) + (1 if specs else 0) if metadata else 0)
    offset = 0
    for i, spec in enumerate(specs):
        total += len(entry_piece(spec, offset)) + (1 if i else 0)
        offset += spec.nbytes
    pad = -total % 8  # the data section starts 8-byte aligned
    yield struct.pack("<Q", total + pad)
    yield b"{" + (meta_piece(metadata) + (b"," if specs else b"") if metadata else b"")
    offset = 0
    for i, spec in enumerate(specs):
        yield (b"," if i else b"") + entry_piece(spec, offset)
        offset += spec.nbytes
    yield b"}" + b" " * pad


def meta_piece(metadata: Mapping[str, str] | None) -> bytes:
    """The ``"__metadata__":{...}`` member of a header."""
    return b'"__metadata__":' + json.dumps(dict(metadata or {}), separators=(",", ":")).encode()


def entry_piece(spec: TensorSpec, offset: int) -> bytes:
    """One tensor's ``"name":{...}`` member of a header, its data at ``offset``.

    Formatted directly (as ``json.dumps`` with compact separators would): it runs once per
    tensor and rank whenever a header is written or checked.
    """
    shape = ",".join(map(str, spec.shape))
    return (
        f'{json.dumps(spec.name)}:{{"dtype":"{safetensors_dtype(spec.dtype)}",'
        f'"shape":[{shape}],"data_offsets":[{offset},{offset + spec.nbytes}]}}'
    ).encode()


def encode_header(specs: Sequence[TensorSpec], metadata: Mapping[str, str] | None = None) -> bytes:
    """The safetensors prefix for ``specs`` laid out in order: 8-byte length, then the header.

    Raises:
        ValueError: Two specs share a name, or a dtype has no safetensors encoding.
    """
    names = {spec.name for spec in specs}
    if len(names) != len(specs) or (metadata and "__metadata__" in names):
        raise ValueError("duplicate tensor name")
    return b"".join(iter_header(specs, metadata))


def read_header(fd: int, size: int, where: Path) -> tuple[int, dict[str, Any]]:
    """Parse a safetensors file's header: (offset of the data section, entries by name).

    Raises:
        ShardError: The file is too short for its header or the header is not valid JSON.
    """
    head = os.pread(fd, 8, 0)
    if len(head) < 8:
        raise ShardError(where, f"{size} bytes is too short for a safetensors file (truncated?)")
    (n,) = struct.unpack("<Q", head)
    if 8 + n > size:
        raise ShardError(where, f"safetensors header of {n} bytes runs past the end (truncated?)")
    try:
        header = json.loads(os.pread(fd, n, 8))
    except ValueError as exc:
        raise ShardError(where, f"safetensors header is not valid JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise ShardError(where, "safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    return 8 + n, cast(dict[str, Any], header)


def write_streaming(
    path: Path,
    specs: Sequence[TensorSpec],
    produce: Callable[[TensorSpec], torch.Tensor],
    metadata: dict[str, str] | None = None,
) -> int:
    """Write ``specs`` to ``path`` calling ``produce`` once per tensor, in order.

    Returns the number of data bytes written. ``produce`` must return a tensor of exactly the
    announced shape and dtype; anything else is a bug upstream and raises ``ValueError``.
    """
    prefix = encode_header(specs, metadata)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        with ChunkedWriter(fd) as out:
            out.write(prefix)
            for spec in specs:
                tensor = produce(spec)
                if tuple(tensor.shape) != spec.shape or tensor.dtype != spec.dtype:
                    raise ValueError(
                        f"{spec.name}: produced {tuple(tensor.shape)} {tensor.dtype}, "
                        f"header announced {spec.shape} {spec.dtype}"
                    )
                out.write(tensor_bytes(tensor))
                del tensor
            size, _ = out.finish()
    finally:
        os.close(fd)
    return size - len(prefix)
