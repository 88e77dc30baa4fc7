"""A streaming safetensors writer: header first, then one tensor at a time.

``safetensors.torch.save_file`` needs every tensor in memory at once. All shapes and dtypes are
known from shard metadata before any data is read, so the header can be written up front and each
tensor appended as soon as it has been assembled, then dropped.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

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


@dataclass(frozen=True)
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
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise ValueError(f"duplicate tensor name {spec.name!r}")
        seen.add(spec.name)
        header[spec.name] = {
            "dtype": safetensors_dtype(spec.dtype),
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
        offset += spec.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data section starts 8-byte aligned
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for spec in specs:
            tensor = produce(spec)
            if tuple(tensor.shape) != spec.shape or tensor.dtype != spec.dtype:
                raise ValueError(
                    f"{spec.name}: produced {tuple(tensor.shape)} {tensor.dtype}, "
                    f"header announced {spec.shape} {spec.dtype}"
                )
            f.write(tensor_bytes(tensor))
            del tensor
    return offset
