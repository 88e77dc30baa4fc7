"""Readers for sharded checkpoints that assemble one tensor (or one region of it) at a time.

Two on-disk layouts are understood:

* per-rank ``torch.save`` files of an FSDP2 ``state_dict()`` (DTensor shards), named as SkyRL names
  them: ``model_world_size_{W}_rank_{R}.pt`` (in the given directory or its ``policy/``);
* ``torch.distributed.checkpoint`` (DCP) directories (``.metadata`` + ``*.distcp``).

Both are validated from metadata alone before any tensor data is read, so bad input fails fast
and names the shard at fault.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import warnings
from abc import ABC, abstractmethod
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self, cast

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.tensor import DTensor, Replicate, Shard

from lora_consolidate import _pages, _plan, _torchmeta
from lora_consolidate._plan import Box, Piece, Segment, intersect, slices, whole
from lora_consolidate._safetensors_stream import TensorSpec, tensor_bytes
from lora_consolidate._torchmeta import StoredTensor
from lora_consolidate.errors import ShardError

RANK_FILE_RE = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")


def rank_file_name(world_size: int, rank: int) -> str:
    """SkyRL's file name for ``rank`` of a ``world_size``-rank checkpoint."""
    return f"model_world_size_{world_size}_rank_{rank}.pt"


def shard_box(
    global_shape: Sequence[int],
    mesh_shape: Sequence[int],
    coordinate: Sequence[int],
    placements: Sequence[Any],
    *,
    where: Path,
    key: str,
) -> tuple[Box, bool]:
    """Region of the global tensor held by the rank at ``coordinate``, and whether it is primary.

    The primary copy is the one at coordinate 0 along every replicated mesh dim.

    Mirrors DTensor's ``Shard(d)`` semantics: ``torch.chunk`` sizes (ceil division, trailing ranks
    may hold empty shards), nested in mesh-dim order.
    """
    offsets = [0] * len(global_shape)
    sizes = list(global_shape)
    primary = True
    for mesh_dim, placement in enumerate(placements):
        if isinstance(placement, Shard) and type(placement) is Shard:  # not _StridedShard
            dim = cast(int, placement.dim)
            n = sizes[dim]
            chunk = math.ceil(n / mesh_shape[mesh_dim]) if n else 0
            start = min(coordinate[mesh_dim] * chunk, n)
            stop = min(start + chunk, n)
            offsets[dim] += start
            sizes[dim] = stop - start
        elif type(placement) is Replicate:
            primary = primary and coordinate[mesh_dim] == 0
        else:
            raise ShardError(where, f"unsupported DTensor placement {placement!r}", key=key)
    return (tuple(offsets), tuple(sizes)), primary


class ShardedCheckpoint(ABC):
    """A sharded checkpoint opened lazily. Use as a context manager or call :meth:`close`."""

    path: Path
    kind: str
    world_size: int | None

    @abstractmethod
    def specs(self) -> list[TensorSpec]:
        """Every tensor's global name, shape and dtype, in checkpoint order."""

    @abstractmethod
    def read(self, name: str, box: Box | None = None) -> torch.Tensor:
        """Assemble tensor ``name`` (or only ``box`` of it) into a fresh CPU tensor."""

    def segments(self, name: str, box: Box | None = None) -> list[Segment]:
        """The row-major bytes of tensor ``name`` (or ``box`` of it), as file ranges if possible.

        Readers that know where shard bytes lie return file ranges (copied without being
        assembled); the default assembles the tensor in memory.
        """
        return [tensor_bytes(self.read(name, box))]

    def placement(self, name: str) -> tuple[Any | None, str]:
        """How ``name`` is laid out over ranks, and the device type of its mesh.

        ``Shard(d)``, ``Replicate()``, or None for a plain tensor; reshard lays it out the same.
        """
        return Shard(0), "cpu"

    def extras(self) -> dict[str, Any]:
        """Non-tensor entries of the state dict (kept by reshard)."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release file handles and mappings."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def tensor_from_bytes(
    data: bytearray, spec_dtype: torch.dtype, shape: Sequence[int]
) -> torch.Tensor:
    """A CPU tensor of ``shape`` viewing ``data`` (row-major bytes of ``spec_dtype``)."""
    if not data:
        return torch.empty(tuple(shape), dtype=spec_dtype)
    return torch.frombuffer(data, dtype=torch.uint8).view(spec_dtype).reshape(tuple(shape))


@dataclass(frozen=True)
class _Piece:
    rank: int
    box: Box
    primary: bool


@dataclass(frozen=True)
class _Entry:
    spec: TensorSpec
    pieces: tuple[_Piece, ...]


@contextlib.contextmanager
def _quiet_torch() -> Generator[None]:
    # Unpickling a DeviceMesh without a process group logs a torch.compile warning that is
    # irrelevant here; DCP warns that it runs without a process group, which is the point.
    logger = logging.getLogger("torch.distributed.device_mesh")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def find_rank_files(path: Path, world_size: int | None = None) -> tuple[Path, int, list[Path]]:
    """Locate ``model_world_size_W_rank_R.pt`` files; return (directory, W, files by rank)."""
    path = Path(path)
    if not path.is_dir():
        raise ShardError(path, "checkpoint directory does not exist")
    directory = path
    found = _scan(path)
    if not found and (path / "policy").is_dir():
        directory = path / "policy"
        found = _scan(directory)
    if not found:
        raise ShardError(path, "no model_world_size_W_rank_R.pt files and no DCP .metadata found")
    sizes = sorted({w for w, _ in found})
    if world_size is None:
        if len(sizes) > 1:
            raise ShardError(
                directory,
                f"rank files of several world sizes {sizes} side by side; "
                "choose one with world_size",
            )
        world_size = sizes[0]
    elif world_size not in sizes:
        raise ShardError(directory, f"no rank files for world size {world_size} (found {sizes})")
    by_rank = {r: p for (w, r), p in found.items() if w == world_size}
    missing = [r for r in range(world_size) if r not in by_rank]
    if missing:
        names = ", ".join(rank_file_name(world_size, r) for r in missing)
        raise ShardError(
            directory / rank_file_name(world_size, missing[0]),
            f"missing rank(s) {missing} of world size {world_size}: {names}",
        )
    extra = sorted(r for r in by_rank if r >= world_size)
    if extra:
        raise ShardError(by_rank[extra[0]], f"rank {extra[0]} is outside world size {world_size}")
    return directory, world_size, [by_rank[r] for r in range(world_size)]


def _scan(directory: Path) -> dict[tuple[int, int], Path]:
    found: dict[tuple[int, int], Path] = {}
    for p in directory.iterdir():
        m = RANK_FILE_RE.match(p.name)
        if m and p.is_file():
            found[int(m.group(1)), int(m.group(2))] = p
    return found


class RankFileCheckpoint(ShardedCheckpoint):
    """Per-rank ``torch.save`` files of FSDP2 DTensor state dicts.

    Each file is opened once. Its metadata is read by the C unpickler without building tensors
    (``loader="fast"``, see ``_torchmeta``), or by ``torch.load(mmap=True, weights_only=True)``
    (``loader="torch"``); ``"auto"`` uses the first and falls back to the second for a file it
    does not model. Tensor bytes are read with ``pread`` at their offset in the file.
    """

    kind = "rank-files"

    def __init__(self, path: Path, world_size: int | None = None, *, loader: str = "auto") -> None:
        if loader not in ("auto", "fast", "torch"):
            raise ValueError(f"loader must be 'auto', 'fast' or 'torch', got {loader!r}")
        self.path, self.world_size, self.files = find_rank_files(path, world_size)
        self._fds: list[int] = []
        self._dicts: list[dict[str, Any]] = []
        self._meshes: dict[tuple[int, int], tuple[tuple[int, ...], int, list[int] | None]] = {}
        try:
            for file in self.files:
                if file.stat().st_size == 0:
                    raise ShardError(file, "empty file")
                self._fds.append(os.open(file, os.O_RDONLY | os.O_CLOEXEC))
            self.loader = "torch"
            if loader != "torch":
                try:
                    with _quiet_torch():
                        self._dicts = [
                            _torchmeta.read_rank_file(f, fd)
                            for f, fd in zip(self.files, self._fds, strict=True)
                        ]
                    self.loader = "fast"
                except _torchmeta.Unrecognised as exc:
                    if loader == "fast":
                        raise ShardError(self.path, f"needs torch.load ({exc})") from exc
            if self.loader == "torch":
                self._dicts = [self._load(file) for file in self.files]
            self._entries = self._validate()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _load(file: Path) -> dict[str, Any]:
        try:
            with _quiet_torch():
                # mmap: only the pages of tensors actually copied are read from disk.
                # weights_only: DTensor, DeviceMesh and placements are on torch's allow-list.
                obj = torch.load(file, map_location="cpu", mmap=True, weights_only=True)
        except Exception as exc:
            raise ShardError(
                file, f"cannot read shard ({type(exc).__name__}: {exc}); truncated or corrupt?"
            ) from exc
        if not isinstance(obj, Mapping):
            raise ShardError(file, f"expected a state dict, found {type(obj).__name__}")
        maps = _pages.file_mappings(file)
        out: dict[str, Any] = {}
        for key, value in cast(Mapping[str, Any], obj).items():
            if isinstance(value, DTensor):
                local = value.to_local()
                out[key] = StoredTensor(
                    tuple(value.shape),
                    value.dtype,
                    tuple(local.shape),
                    _pages.file_offset(local, maps),
                    value.device_mesh,
                    tuple(value.placements),
                    local,
                )
            elif isinstance(value, torch.Tensor):
                shape = tuple(value.shape)
                offset = _pages.file_offset(value, maps)
                out[key] = StoredTensor(shape, value.dtype, shape, offset, None, (), value)
            else:
                out[key] = value
        return out

    def _validate(self) -> dict[str, _Entry]:
        first = self._dicts[0]
        for rank, sd in enumerate(self._dicts[1:], start=1):
            missing = [k for k in first if k not in sd]
            if missing:
                raise ShardError(
                    self.files[rank], "key present in rank 0 is missing here", key=missing[0]
                )
            extra = [k for k in sd if k not in first]
            if extra:
                raise ShardError(self.files[rank], "key absent from rank 0", key=extra[0])
        entries: dict[str, _Entry] = {}
        for key, ref in first.items():
            if not isinstance(ref, StoredTensor):
                continue
            pieces: list[_Piece] = []
            for rank, sd in enumerate(self._dicts):
                pieces.append(self._piece(rank, key, sd[key], ref))
            spec = TensorSpec(key, ref.shape, ref.dtype)
            covered = sum(math.prod(p.box[1]) for p in pieces if p.primary)
            if covered != math.prod(spec.shape):
                raise ShardError(
                    self.path,
                    f"shards cover {covered} elements of a {list(spec.shape)} tensor",
                    key=key,
                )
            entries[key] = _Entry(spec, tuple(pieces))
        return entries

    def _mesh_info(self, rank: int, mesh: Any) -> tuple[tuple[int, ...], int, list[int] | None]:
        # DeviceMesh.mesh is computed on every access; every entry of a file shares one mesh.
        cache_key = (rank, id(mesh))
        info = self._meshes.get(cache_key)
        if info is None:
            tensor = cast(torch.Tensor, mesh.mesh)
            where = (tensor == rank).nonzero()
            coordinate = (
                [int(c) for c in cast(list[int], where[0].tolist())]
                if where.shape[0] == 1
                else None
            )
            info = (tuple(tensor.shape), tensor.numel(), coordinate)
            self._meshes[cache_key] = info
        return info

    def _piece(self, rank: int, key: str, value: Any, ref: StoredTensor) -> _Piece:
        file = self.files[rank]
        world = self.world_size
        assert world is not None
        if not isinstance(value, StoredTensor):
            raise ShardError(file, f"expected a tensor, found {type(value).__name__}", key=key)
        if value.dtype != ref.dtype:
            raise ShardError(
                file, f"dtype {value.dtype} differs from rank 0 ({ref.dtype})", key=key
            )
        if value.shape != ref.shape:
            raise ShardError(
                file,
                f"global shape {list(value.shape)} differs from rank 0 ({list(ref.shape)})",
                key=key,
            )
        if value.mesh is None:
            if ref.mesh is not None:
                raise ShardError(file, "plain tensor where rank 0 holds a DTensor", key=key)
            # A plain tensor in every rank file is a replicated value: rank 0's copy is used.
            return _Piece(rank, whole(value.shape), rank == 0)
        mesh_shape, numel, coordinate = self._mesh_info(rank, value.mesh)
        if numel != world:
            raise ShardError(
                file,
                f"saved on a {numel}-rank device mesh but the file name says world size "
                f"{world} (mismatched world sizes)",
                key=key,
            )
        if coordinate is None:
            raise ShardError(file, f"rank {rank} is not in the DTensor's device mesh", key=key)
        box, primary = shard_box(
            value.shape, mesh_shape, coordinate, value.placements, where=file, key=key
        )
        if value.local_shape != box[1]:
            raise ShardError(
                file,
                f"local shard shape {list(value.local_shape)} does not add up: rank {rank} of "
                f"{world} should hold {list(box[1])} of global {list(value.shape)} "
                f"({list(value.placements)})",
                key=key,
            )
        return _Piece(rank, box, primary)

    def specs(self) -> list[TensorSpec]:
        return [e.spec for e in self._entries.values()]

    def extras(self) -> dict[str, Any]:
        return {k: v for k, v in self._dicts[0].items() if not isinstance(v, StoredTensor)}

    def stored(self, rank: int, key: str) -> StoredTensor:
        """What rank ``rank``'s file holds for tensor ``key``."""
        value = self._dicts[rank][key]
        if not isinstance(value, StoredTensor):
            raise KeyError(key)
        return value

    def placement(self, name: str) -> tuple[Any | None, str]:
        value = self.stored(0, name)
        if value.mesh is None:
            return None, "cpu"
        device_type = str(value.mesh.device_type)
        placements = value.placements
        if len(placements) == 1 and isinstance(placements[0], Shard | Replicate):
            return placements[0], device_type
        return Shard(0), device_type

    def _pieces(self, name: str) -> list[Piece] | None:
        pieces: list[Piece] = []
        for piece in self._entries[name].pieces:
            if not piece.primary or not math.prod(piece.box[1]):
                continue
            offset = self.stored(piece.rank, name).offset
            if offset is None:
                return None
            pieces.append(Piece(piece.box, self._fds[piece.rank], self.files[piece.rank], offset))
        return pieces

    def segments(self, name: str, box: Box | None = None) -> list[Segment]:
        spec = self._entries[name].spec
        pieces = self._pieces(name)
        if pieces is None:
            return super().segments(name, box)
        return _plan.segments(name, spec.dtype.itemsize, box or whole(spec.shape), pieces)

    def read(self, name: str, box: Box | None = None) -> torch.Tensor:
        spec = self._entries[name].spec
        box = box or whole(spec.shape)
        if self._pieces(name) is not None:
            data = _plan.gather(
                name, self.segments(name, box), math.prod(box[1]) * spec.dtype.itemsize
            )
            return tensor_from_bytes(data, spec.dtype, box[1])
        # torch.load path where a tensor's file offset is unknown: copy through the mapping.
        out = torch.empty(box[1], dtype=spec.dtype)
        for piece in self._entries[name].pieces:
            overlap = intersect(piece.box, box) if piece.primary else None
            if overlap is None or not math.prod(overlap[1]):
                continue
            local = self.stored(piece.rank, name).local
            assert local is not None
            out[slices(overlap, box[0])] = local[slices(overlap, piece.box[0])]
            _pages.release(local, _pages.file_mappings(self.files[piece.rank]))
        return out

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        self._dicts = []
        self._entries = {}


class _CachedMetadataReader:
    """Factory for a FileSystemReader that parses ``.metadata`` once, not once per tensor."""

    @staticmethod
    def make(path: Path) -> Any:
        from torch.distributed.checkpoint.filesystem import FileSystemReader
        from torch.distributed.checkpoint.metadata import Metadata

        class Reader(FileSystemReader):
            _cached: Metadata | None = None

            def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
                if self._cached is None:
                    self._cached = super().read_metadata(*args, **kwargs)
                return self._cached

        return Reader(path)


class DcpCheckpoint(ShardedCheckpoint):
    """A ``torch.distributed.checkpoint`` directory, read one tensor at a time.

    No process group is needed: each tensor is ``dcp.load(no_dist=True)``-ed into a preallocated
    tensor.
    """

    kind = "dcp"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        meta_file = self.path / ".metadata"
        if not meta_file.is_file():
            raise ShardError(meta_file, "DCP metadata file is missing")
        self._reader = _CachedMetadataReader.make(self.path)
        try:
            with _quiet_torch():
                self._meta = self._reader.read_metadata()
        except Exception as exc:
            raise ShardError(
                meta_file, f"cannot read DCP metadata ({type(exc).__name__}: {exc})"
            ) from exc
        self._specs = self._validate()
        self._by_name = {s.name: s for s in self._specs}
        self.world_size = len(self.files)

    def _validate(self) -> list[TensorSpec]:
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        meta_file = self.path / ".metadata"
        needed: dict[str, int] = {}
        storage: dict[Any, Any] = self._meta.storage_data or {}
        self._files_of: dict[str, set[str]] = {}
        for index, info in storage.items():
            rel = str(info.relative_path)
            self._files_of.setdefault(str(index.fqn), set()).add(rel)
            needed[rel] = max(needed.get(rel, 0), int(info.offset) + int(info.length))
        self.files = [self.path / rel for rel in sorted(needed)]
        for rel, size in sorted(needed.items()):
            file = self.path / rel
            if not file.is_file():
                raise ShardError(file, "DCP storage file referenced by .metadata is missing")
            actual = file.stat().st_size
            if actual < size:
                raise ShardError(file, f"truncated: {actual} bytes on disk, .metadata needs {size}")
        specs: list[TensorSpec] = []
        for key, md in self._meta.state_dict_metadata.items():
            if not isinstance(md, TensorStorageMetadata):
                continue
            shape = tuple(int(s) for s in md.size)
            covered = 0
            for chunk in md.chunks:
                for o, s, g in zip(chunk.offsets, chunk.sizes, shape, strict=True):
                    if o < 0 or o + s > g:
                        raise ShardError(
                            meta_file,
                            f"chunk at {list(chunk.offsets)} size {list(chunk.sizes)} "
                            f"lies outside the global shape {list(shape)}",
                            key=key,
                        )
                covered += math.prod(chunk.sizes)
            if covered != math.prod(shape):
                raise ShardError(
                    meta_file,
                    f"chunks cover {covered} elements of a {list(shape)} tensor",
                    key=key,
                )
            specs.append(TensorSpec(key, shape, md.properties.dtype))
        return specs

    def specs(self) -> list[TensorSpec]:
        return list(self._specs)

    def read(self, name: str, box: Box | None = None) -> torch.Tensor:
        from torch.distributed.checkpoint.state_dict_loader import (
            load as dcp_load,  # pyright: ignore[reportUnknownVariableType]
        )

        spec = self._by_name[name]
        full = torch.empty(spec.shape, dtype=spec.dtype)
        try:
            with _quiet_torch():
                dcp_load({name: full}, storage_reader=self._reader, no_dist=True)
        except (Exception, CheckpointException) as exc:  # CheckpointException is a BaseException
            # Its text is a whole remote traceback; its last line says what went wrong.
            lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
            files = sorted(self._files_of.get(name, set()))
            raise ShardError(
                self.path / files[0] if len(files) == 1 else self.path,
                f"cannot load tensor from {', '.join(files) or 'storage'} "
                f"({lines[-1] if lines else type(exc).__name__})",
                key=name,
            ) from exc
        if box is None:
            return full
        return full[slices(box, tuple(0 for _ in spec.shape))].clone()


def open_checkpoint(
    path: Path | str, world_size: int | None = None, *, loader: str = "auto"
) -> ShardedCheckpoint:
    """Open a checkpoint, auto-detected: DCP directory, project shard format, or rank files.

    ``loader`` picks how ``torch.save`` rank files are read (see :class:`RankFileCheckpoint`).
    """
    from lora_consolidate.shards import ShardsCheckpoint, has_shards

    path = Path(path)
    if (path / ".metadata").is_file():
        return DcpCheckpoint(path)
    if has_shards(path):
        return ShardsCheckpoint(path, world_size)
    return RankFileCheckpoint(path, world_size, loader=loader)
