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

from lora_consolidate import _pages
from lora_consolidate._safetensors_stream import TensorSpec
from lora_consolidate.errors import ShardError

RANK_FILE_RE = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")


def rank_file_name(world_size: int, rank: int) -> str:
    """SkyRL's file name for ``rank`` of a ``world_size``-rank checkpoint."""
    return f"model_world_size_{world_size}_rank_{rank}.pt"


Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, sizes)


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


def _intersect(a: Box, b: Box) -> Box | None:
    offsets: list[int] = []
    sizes: list[int] = []
    for ao, asz, bo, bsz in zip(a[0], a[1], b[0], b[1], strict=True):
        lo, hi = max(ao, bo), min(ao + asz, bo + bsz)
        if hi <= lo:
            return None
        offsets.append(lo)
        sizes.append(hi - lo)
    return tuple(offsets), tuple(sizes)


def _slices(box: Box, origin: Sequence[int]) -> tuple[slice, ...]:
    return tuple(slice(o - base, o - base + s) for o, s, base in zip(*box, origin, strict=True))


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
    """Per-rank ``torch.save`` files of FSDP2 DTensor state dicts, memory-mapped."""

    kind = "rank-files"

    def __init__(self, path: Path, world_size: int | None = None) -> None:
        self.path, self.world_size, self.files = find_rank_files(path, world_size)
        self._dicts: list[Mapping[str, Any]] = []
        self._maps: list[list[_pages.Mapping]] = []
        self._fds: list[int] = []
        for file in self.files:
            self._dicts.append(self._load(file))
            self._maps.append(_pages.file_mappings(file))
            self._fds.append(os.open(file, os.O_RDONLY))
        self._entries = self._validate()

    @staticmethod
    def _load(file: Path) -> Mapping[str, Any]:
        if file.stat().st_size == 0:
            raise ShardError(file, "empty file")
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
        return obj  # pyright: ignore[reportUnknownVariableType]

    def _validate(self) -> dict[str, _Entry]:
        world = self.world_size
        assert world is not None
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
            if not isinstance(ref, torch.Tensor):
                continue
            pieces: list[_Piece] = []
            for rank, sd in enumerate(self._dicts):
                pieces.append(self._piece(rank, key, sd[key], ref))
            spec = TensorSpec(key, tuple(ref.shape), ref.dtype)
            covered = sum(math.prod(p.box[1]) for p in pieces if p.primary)
            if covered != math.prod(spec.shape):
                raise ShardError(
                    self.path,
                    f"shards cover {covered} elements of a {list(spec.shape)} tensor",
                    key=key,
                )
            entries[key] = _Entry(spec, tuple(pieces))
        return entries

    def _piece(self, rank: int, key: str, value: Any, ref: torch.Tensor) -> _Piece:
        file = self.files[rank]
        world = self.world_size
        assert world is not None
        if not isinstance(value, torch.Tensor):
            raise ShardError(file, f"expected a tensor, found {type(value).__name__}", key=key)
        if value.dtype != ref.dtype:
            raise ShardError(
                file, f"dtype {value.dtype} differs from rank 0 ({ref.dtype})", key=key
            )
        if tuple(value.shape) != tuple(ref.shape):
            raise ShardError(
                file,
                f"global shape {list(value.shape)} differs from rank 0 ({list(ref.shape)})",
                key=key,
            )
        if not isinstance(value, DTensor):
            if isinstance(ref, DTensor):
                raise ShardError(file, "plain tensor where rank 0 holds a DTensor", key=key)
            # A plain tensor in every rank file is a replicated value: rank 0's copy is used.
            return _Piece(rank, (tuple(0 for _ in value.shape), tuple(value.shape)), rank == 0)
        mesh = value.device_mesh.mesh
        if mesh.numel() != world:
            raise ShardError(
                file,
                f"saved on a {mesh.numel()}-rank device mesh but the file name says world size "
                f"{world} (mismatched world sizes)",
                key=key,
            )
        where = (mesh == rank).nonzero()
        if where.shape[0] != 1:
            raise ShardError(file, f"rank {rank} is not in the DTensor's device mesh", key=key)
        coordinate: list[int] = [int(c) for c in cast(list[int], where[0].tolist())]
        box, primary = shard_box(
            tuple(value.shape),
            tuple(mesh.shape),
            coordinate,
            value.placements,
            where=file,
            key=key,
        )
        local_shape = tuple(value.to_local().shape)
        if local_shape != box[1]:
            raise ShardError(
                file,
                f"local shard shape {list(local_shape)} does not add up: rank {rank} of {world} "
                f"should hold {list(box[1])} of global {list(value.shape)} "
                f"({list(value.placements)})",
                key=key,
            )
        return _Piece(rank, box, primary)

    def specs(self) -> list[TensorSpec]:
        return [e.spec for e in self._entries.values()]

    def extras(self) -> dict[str, Any]:
        return {k: v for k, v in self._dicts[0].items() if not isinstance(v, torch.Tensor)}

    def value(self, rank: int, key: str) -> Any:
        """The raw state-dict value (DTensor, tensor or other) of ``key`` in rank ``rank``."""
        return self._dicts[rank][key]

    def _local(self, rank: int, key: str) -> torch.Tensor:
        value = self._dicts[rank][key]
        return value.to_local() if isinstance(value, DTensor) else value

    def read(self, name: str, box: Box | None = None) -> torch.Tensor:
        entry = self._entries[name]
        if box is None:
            box = (tuple(0 for _ in entry.spec.shape), entry.spec.shape)
        out = torch.empty(box[1], dtype=entry.spec.dtype)
        for piece in entry.pieces:
            if not piece.primary:
                continue
            overlap = _intersect(piece.box, box) if math.prod(box[1]) else None
            if overlap is None:
                continue
            local = self._local(piece.rank, name)
            offset = _pages.file_offset(local, self._maps[piece.rank])
            if offset is None:
                out[_slices(overlap, box[0])] = local[_slices(overlap, piece.box[0])]
                _pages.release(local, self._maps[piece.rank])
                continue
            shard = self._pread(piece.rank, name, local, offset)
            out[_slices(overlap, box[0])] = shard[_slices(overlap, piece.box[0])]
        return out

    def _pread(self, rank: int, key: str, like: torch.Tensor, offset: int) -> torch.Tensor:
        shard = torch.empty(like.shape, dtype=like.dtype)
        if shard.numel() == 0:
            return shard
        view = memoryview(shard.reshape(-1).view(torch.uint8).numpy())
        fd = self._fds[rank]
        done = 0
        while done < len(view):
            n = os.preadv(fd, [view[done:]], offset + done)
            if n == 0:
                raise ShardError(self.files[rank], "file ends inside tensor data", key=key)
            done += n
        return shard

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
        return full[_slices(box, tuple(0 for _ in spec.shape))].clone()


def open_checkpoint(path: Path | str, world_size: int | None = None) -> ShardedCheckpoint:
    """Open a DCP directory or a directory of per-rank FSDP files (auto-detected)."""
    path = Path(path)
    if (path / ".metadata").is_file():
        return DcpCheckpoint(path)
    return RankFileCheckpoint(path, world_size)
