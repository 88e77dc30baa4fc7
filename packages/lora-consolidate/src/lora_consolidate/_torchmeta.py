"""Read a ``torch.save`` rank file's metadata without building its tensors.

``torch.load(weights_only=True)`` runs torch's pure-Python unpickler and builds every DTensor
(a tensor subclass with its spec) before any data can be read; for 2,016 DTensors that is seconds.
Here the C unpickler reads the same pickle with the same allow-list (torch's own safe globals,
nothing else can be named), but the tensor rebuild functions are replaced by small records of
what they would build: storage key, offset, shape, stride, dtype, and for a DTensor its global
shape and ``DTensorSpec``. Specs, placements and device meshes are the real torch objects (a
mesh is pickled once per file). A tensor's bytes are then located in the zip archive (records
are stored uncompressed) and read with ``pread`` when needed.

Anything this reader does not model (another tensor rebuild function, a non-contiguous local
tensor, a big-endian file) raises :class:`Unrecognised`; callers then use ``torch.load``.
"""

from __future__ import annotations

import collections
import gc
import importlib
import io
import math
import os
import pickle
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, cast

import torch

from lora_consolidate.errors import ShardError


class Unrecognised(Exception):  # noqa: N818 - an internal signal, never shown to users
    """The file uses a construct this reader does not model; read it with ``torch.load``."""


@dataclass(slots=True)
class StoredTensor:
    """One tensor entry of a rank file: global and local shape, where its local bytes are.

    ``mesh`` and ``placements`` are those of a DTensor (``mesh`` is None for a plain tensor).
    ``offset`` is the file offset of the contiguous local tensor's first byte, when known;
    ``local`` is the tensor itself when the file was read by ``torch.load``.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    local_shape: tuple[int, ...]
    offset: int | None
    mesh: Any | None
    placements: tuple[Any, ...] = ()
    local: torch.Tensor | None = field(default=None, repr=False)


@dataclass(slots=True)
class _StorageRef:
    key: str
    dtype: torch.dtype
    numel: int


@dataclass(slots=True)
class _TensorRef:
    storage: _StorageRef
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(slots=True)
class _DTensorRef:
    dtype: torch.dtype
    size: tuple[int, ...]
    local: Any = None
    spec: Any = None


def _rebuild_tensor_v2(
    storage: Any,
    storage_offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    *_rest: Any,
) -> _TensorRef:
    if not isinstance(storage, _StorageRef):
        raise Unrecognised("tensor without a file storage")
    return _TensorRef(storage, int(storage_offset), tuple(size), tuple(stride))


def _rebuild_parameter(data: Any, *_rest: Any) -> Any:
    return data


def _rebuild_wrapper_subclass(cls: Any, dtype: torch.dtype, size: Any, *_rest: Any) -> _DTensorRef:
    from torch.distributed.tensor import DTensor

    if cls is not DTensor:
        raise Unrecognised(f"tensor subclass {cls!r}")
    return _DTensorRef(dtype, tuple(int(s) for s in size))


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    ref = func(*args)
    if not isinstance(ref, _DTensorRef):
        raise Unrecognised(f"tensor subclass {new_type!r}")
    slots: Any = cast(tuple[Any, Any], state)[1] if isinstance(state, tuple) else state
    try:
        ref.local = slots["_local_tensor"]
        ref.spec = slots["_spec"]
    except (KeyError, TypeError):
        raise Unrecognised("DTensor state without _local_tensor/_spec") from None
    return ref


_STAND_INS: dict[str, Any] = {
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor_v2,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "torch._utils._rebuild_parameter_with_state": _rebuild_parameter,
    "torch._utils._rebuild_wrapper_subclass": _rebuild_wrapper_subclass,
    "torch._tensor._rebuild_from_type_v2": _rebuild_from_type_v2,
}


def _allowed() -> dict[str, Any]:
    importlib.import_module("torch.distributed.tensor")  # registers DTensor & co. as safe

    allowed: dict[str, Any] = {
        "collections.OrderedDict": collections.OrderedDict,
        "torch.Size": torch.Size,
        "torch.device": torch.device,
        "torch.serialization._get_layout": torch.serialization._get_layout,  # pyright: ignore[reportPrivateUsage]
        "builtins.set": set,
        "builtins.bytearray": bytearray,
        "builtins.complex": complex,
    }
    for g in cast(list[Any], torch.serialization.get_safe_globals()):
        if isinstance(g, tuple):
            obj, name = cast(tuple[Any, str], g)
            allowed[name] = obj
        else:
            allowed[f"{g.__module__}.{g.__qualname__}"] = g
    allowed.update(_STAND_INS)
    return allowed


class _Unpickler(pickle.Unpickler):
    allowed: ClassVar[dict[str, Any]] = {}

    def find_class(self, module: str, name: str) -> Any:
        full = f"{module}.{name}"
        found = self.allowed.get(full)
        if found is not None:
            return found
        if module == "torch":
            attr = getattr(torch, name, None)
            if isinstance(attr, torch.dtype):
                return attr
            if name.endswith("Storage") and isinstance(attr, type):
                return torch.serialization.StorageType(name)
        # Unknown to this reader, maybe not to torch.load: let it decide (and explain).
        raise Unrecognised(f"global {full}")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):  # pyright: ignore[reportUnknownArgumentType]
            raise Unrecognised(f"persistent id {pid!r}")
        _, storage_type, key, _location, numel = cast(tuple[Any, Any, Any, Any, Any], pid)
        dtype = storage_type if isinstance(storage_type, torch.dtype) else storage_type.dtype
        return _StorageRef(str(key), dtype, int(numel))


def _contiguous(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expected = 1
    for s, st in zip(reversed(size), reversed(stride), strict=True):
        if s != 1 and st != expected:
            return False
        expected *= s
    return True


class _Archive:
    """Where each storage record's bytes start in the zip file."""

    def __init__(self, path: Path, fd: int, zf: zipfile.ZipFile, prefix: str) -> None:
        self.path = path
        self._fd = fd
        self._zf = zf
        self._prefix = prefix

    def record(self, key: str) -> tuple[int, int]:
        """(file offset of the data, size) of storage ``key``."""
        try:
            info = self._zf.getinfo(f"{self._prefix}data/{key}")
        except KeyError:
            raise ShardError(self.path, f"storage record data/{key} is missing") from None
        if info.compress_type != zipfile.ZIP_STORED:
            raise Unrecognised("compressed storage record")
        local = os.pread(self._fd, 30, info.header_offset)
        if len(local) < 30 or local[:4] != b"PK\x03\x04":
            raise ShardError(self.path, f"bad zip entry for storage {key} (truncated or corrupt?)")
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        return info.header_offset + 30 + name_len + extra_len, info.file_size

    def tensor(self, ref: _TensorRef) -> torch.Tensor:
        start, size = self.record(ref.storage.key)
        data = bytearray(os.pread(self._fd, size, start))
        flat = torch.frombuffer(data, dtype=ref.storage.dtype) if data else torch.empty(0)
        return flat.as_strided(ref.size, ref.stride, ref.offset)


def _refs_inside(value: Any) -> bool:
    if isinstance(value, _TensorRef | _DTensorRef):
        return True
    if isinstance(value, dict):
        return any(_refs_inside(v) for v in cast(dict[Any, Any], value).values())
    if isinstance(value, list | tuple | set):
        return any(_refs_inside(v) for v in cast(list[Any], value))
    return False


def read_rank_file(path: Path, fd: int) -> dict[str, Any]:
    """The state dict of rank file ``path`` (open as ``fd``), every tensor a :class:`StoredTensor`.

    Raises:
        ShardError: The archive is damaged (a storage record is missing or cut short).
        Unrecognised: The file needs ``torch.load`` (not a zip archive, or a construct this
            reader does not model).
    """
    if not _Unpickler.allowed:
        _Unpickler.allowed = _allowed()
    try:
        # The descriptor is shared with the caller's preads; zipfile seeks it, pread does not.
        zf = zipfile.ZipFile(io.FileIO(fd, closefd=False))
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        # A truncated archive, or torch's legacy (pre-zip) format: torch.load tells which.
        raise Unrecognised(f"not a zip archive ({exc})") from exc
    with zf:
        pickles = [n for n in zf.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
        if len(pickles) != 1:
            raise Unrecognised("no single data.pkl")
        prefix = pickles[0].removesuffix("data.pkl")
        order = f"{prefix}byteorder"
        if order in zf.NameToInfo and zf.read(order) != b"little":
            raise Unrecognised("big-endian file")
        try:
            # Thousands of small objects: a cyclic GC pass over torch's heap each few hundred
            # allocations would cost more than the unpickling itself.
            enabled = gc.isenabled()
            gc.disable()
            try:
                obj = _Unpickler(io.BytesIO(zf.read(pickles[0]))).load()
            finally:
                if enabled:
                    gc.enable()
        except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError, OSError) as exc:
            raise ShardError(
                path, f"cannot read shard ({type(exc).__name__}: {exc}); truncated or corrupt?"
            ) from exc
        if not isinstance(obj, dict):
            raise Unrecognised("not a state dict")
        return _resolve(cast(dict[Any, Any], obj), _Archive(path, fd, zf, prefix))


def _resolve(state: dict[Any, Any], archive: _Archive) -> dict[str, Any]:
    out: dict[str, Any] = {}
    meshes: set[int] = set()
    for key, value in state.items():
        if isinstance(value, _DTensorRef):
            spec = value.spec
            mesh = getattr(spec, "mesh", None)
            local = value.local
            if mesh is None or not isinstance(local, _TensorRef):
                raise Unrecognised("DTensor without a mesh or a local tensor")
            if id(mesh) not in meshes:
                meshes.add(id(mesh))
                # A mesh's rank map is a (tiny) tensor of its own: build it for real.
                for attr, sub in list(cast(dict[str, Any], vars(mesh)).items()):
                    if isinstance(sub, _TensorRef):
                        setattr(mesh, attr, archive.tensor(sub))
            out[str(key)] = _stored(
                archive, local, value.size, value.dtype, mesh=mesh, placements=spec.placements
            )
        elif isinstance(value, _TensorRef):
            out[str(key)] = _stored(
                archive, value, value.size, value.storage.dtype, mesh=None, placements=()
            )
        elif _refs_inside(value):
            raise Unrecognised("tensors nested inside a state-dict value")
        else:
            out[str(key)] = value
    return out


def _stored(
    archive: _Archive,
    local: _TensorRef,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    *,
    mesh: Any,
    placements: Any,
) -> StoredTensor:
    if local.storage.dtype != dtype:
        raise Unrecognised("local tensor dtype differs from the DTensor's")
    if not _contiguous(local.size, local.stride):
        raise Unrecognised("non-contiguous local tensor")
    numel = math.prod(local.size)
    offset: int | None = None
    if numel:
        start, size = archive.record(local.storage.key)
        end = (local.offset + numel) * dtype.itemsize
        if end > size or local.offset < 0:
            raise ShardError(archive.path, f"storage data/{local.storage.key} is too short")
        offset = start + local.offset * dtype.itemsize
    return StoredTensor(shape, dtype, local.size, offset, mesh, tuple(placements))
