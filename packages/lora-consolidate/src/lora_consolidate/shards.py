"""The project's shard format: per rank, a safetensors file of its local shards and a JSON index.

Written by each FSDP rank for itself (no gather, no process group needed), read with no
unpickling at all: the index says which region of which global tensor every rank holds, the
safetensors header where its bytes lie, so consolidation and resharding copy byte ranges.

A checkpoint directory holds, for ``kind`` ``model`` (LoRA weights) and ``optim`` (their
optimizer state)::

    {kind}_world_size_{W}_rank_{R}.safetensors  rank R's local shards, in index order
    {kind}_world_size_{W}_rank_{R}.index.json   rank R's part of the index (written after it)
    {kind}_world_size_{W}.index.json            the merged index, once all ranks are done

Every file is written atomically (temp file, fsync, rename). A rank's part records its data
file's size and checksum (``hash_algorithm``, ``digest``) and one row per tensor, ``[name, dtype, global shape, offsets, sizes,
placement]``: the rank holds ``global[offsets : offsets + sizes]``; placement is ``"S<d>"``
(sharded on dim d over the ranks, ``torch.chunk`` sizes as FSDP2) or ``"R"`` (replicated:
rank 0 alone stores it). Rows are one per line, so a reader parses one at a time and keeps
only a compact table (memory stays small for thousands of tensors); any other valid JSON
layout is read too. The merged index (:func:`finalize_rank_shards`, rank 0 after a barrier)
lists every part (its sha256) and data file (its checksum) once they were checked to agree and to tile
every tensor; without it, readers check and merge the parts themselves.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import struct
import time
import uuid
from array import array
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, cast

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

from lora_consolidate import _plan, keys
from lora_consolidate._hashing import AUTO, SHA256, resolve
from lora_consolidate._plan import Box, Piece, Segment, whole
from lora_consolidate._safetensors_stream import (
    DTYPES_BY_NAME,
    TensorSpec,
    entry_piece,
    iter_header,
    meta_piece,
    read_header,
    safetensors_dtype,
    tensor_bytes,
)
from lora_consolidate._writer import ChunkedWriter
from lora_consolidate.errors import ConsolidationError, ShardError
from lora_consolidate.sources import ShardedCheckpoint, shard_box, tensor_from_bytes
from weight_sync import fs

FORMAT = "lora-consolidate/shards/v1"
KINDS = ("model", "optim")
_PART_RE = re.compile(r"^(model|optim)_world_size_(\d+)_rank_(\d+)\.index\.json$")
_INDEX_RE = re.compile(r"^(model|optim)_world_size_(\d+)\.index\.json$")


def data_file_name(kind: str, world_size: int, rank: int) -> str:
    """Rank ``rank``'s safetensors file of ``kind`` in a ``world_size``-rank checkpoint."""
    return f"{kind}_world_size_{world_size}_rank_{rank}.safetensors"


def part_file_name(kind: str, world_size: int, rank: int) -> str:
    """Rank ``rank``'s part of the placement index."""
    return f"{kind}_world_size_{world_size}_rank_{rank}.index.json"


def index_file_name(kind: str, world_size: int) -> str:
    """The merged placement index of ``kind``."""
    return f"{kind}_world_size_{world_size}.index.json"


@dataclass(frozen=True)
class LocalShard:
    """A rank's region of a global tensor, given without a DTensor.

    ``tensor`` is ``global[offsets : offsets + tensor.shape]`` of a tensor of ``shape``;
    ``shard_dim`` is the dim split over the ranks (None: replicated, stored by rank 0 only).
    """

    tensor: torch.Tensor
    shape: tuple[int, ...]
    offsets: tuple[int, ...]
    shard_dim: int | None = 0


@dataclass(frozen=True)
class RankShardsResult:
    """What :func:`write_rank_shards` wrote: the files, how many tensors and data bytes."""

    files: tuple[Path, ...]
    tensors: int
    bytes_written: int
    seconds: float


class _Row(NamedTuple):
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    box: Box
    placement: str  # "S<d>" or "R"

    def to_json(self) -> list[Any]:
        return [
            self.name,
            safetensors_dtype(self.dtype),
            list(self.shape),
            list(self.box[0]),
            list(self.box[1]),
            self.placement,
        ]


# ----------------------------------------------------------------------------------- writing


def _placement_str(placements: Sequence[Any]) -> str:
    for p in placements:
        if isinstance(p, Shard) and type(p) is Shard:
            return f"S{p.dim}"
    return "R"


def _mesh_coordinate(
    mesh: Any, rank: int, key: str, where: Path
) -> tuple[tuple[int, ...], list[int]]:
    tensor = cast(torch.Tensor, mesh.mesh)
    found = (tensor == rank).nonzero()
    if found.shape[0] != 1:
        raise ConsolidationError(f"{where}: rank {rank} is not in the device mesh of {key!r}")
    return tuple(tensor.shape), [int(c) for c in cast(list[int], found[0].tolist())]


def _local_row(
    key: str, value: Any, rank: int, world_size: int, *, where: Path, meshes: dict[int, Any]
) -> tuple[_Row, torch.Tensor] | None:
    """The index row and local tensor ``rank`` stores for ``value``; None if another rank does."""
    if isinstance(value, DTensor):
        mesh = value.device_mesh
        info = meshes.get(id(mesh))
        if info is None:
            info = meshes[id(mesh)] = _mesh_coordinate(mesh, rank, key, where)
        mesh_shape, coordinate = info
        if math.prod(mesh_shape) != world_size:
            raise ConsolidationError(
                f"{where}: {key!r} lives on a {math.prod(mesh_shape)}-rank mesh, not "
                f"world size {world_size}"
            )
        box, primary = shard_box(
            tuple(value.shape), mesh_shape, coordinate, value.placements, where=where, key=key
        )
        if not primary:  # a replica along an HSDP replicate dim: the first replica stores it
            return None
        local = value.to_local()
        if tuple(local.shape) != box[1]:
            raise ConsolidationError(
                f"{where}: {key!r} local shard {list(local.shape)} is not the {list(box[1])} "
                f"that {list(value.placements)} gives rank {rank}"
            )
        row = _Row(key, value.dtype, tuple(value.shape), box, _placement_str(value.placements))
        return row, local
    if isinstance(value, LocalShard):
        box = (tuple(value.offsets), tuple(value.tensor.shape))
        if len(box[0]) != len(value.shape) or any(
            o < 0 or o + s > g for o, s, g in zip(*box, value.shape, strict=True)
        ):
            raise ConsolidationError(f"{where}: {key!r} region {box} lies outside {value.shape}")
        placement = "R" if value.shard_dim is None else f"S{value.shard_dim}"
        if placement == "R" and rank != 0:
            return None
        return _Row(key, value.tensor.dtype, tuple(value.shape), box, placement), value.tensor
    if isinstance(value, torch.Tensor):
        if rank != 0:  # a plain tensor is the same on every rank: rank 0 stores it
            return None
        shape = tuple(value.shape)
        return _Row(key, value.dtype, shape, whole(shape), "R"), value
    raise TypeError(type(value).__name__)


def _jsonable(value: Any, where: str) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise ConsolidationError(f"{where}: not JSON-serialisable ({exc})") from exc
    return value


_TENSORS_OPEN = b', "tensors": [\n'
_TENSORS_CLOSE = b"]}\n"
_METADATA = {"format": "pt"}
_CHECKSUM = ("size", "hash_algorithm", "digest")  # what a part records of its data file


def _write_atomic(
    path: Path, pieces: Iterable[Segment | bytes], *, durable: bool, algorithm: str = SHA256
) -> tuple[int, str]:
    """Stream ``pieces`` into a temp file beside ``path`` and rename it over; (size, digest)."""
    tmp = path.with_name(f".{path.name}.tmp.{uuid.uuid4().hex[:12]}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        try:
            with ChunkedWriter(fd, algorithm=algorithm, durable=durable) as out:
                for piece in pieces:
                    if isinstance(piece, _plan.FileRange):
                        out.copy_range(piece.fd, piece.offset, piece.nbytes, where=piece.path)
                    else:
                        out.write(piece)
                size, sha = out.finish()
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fs.fsync_dir(path.parent)
    return size, sha


class _LocalSpecs(Collection[TensorSpec]):
    """Name, local shape and dtype of each row, made as iterated (not held for every tensor)."""

    def __init__(self, rows: Collection[_Row]) -> None:
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[TensorSpec]:
        return (TensorSpec(r.name, r.box[1], r.dtype) for r in self._rows)

    def __contains__(self, item: object) -> bool:
        return any(item == spec for spec in self)


class _TargetRows(Collection[_Row]):
    """The rows of one target rank of a reshard, made on every pass over them."""

    def __init__(
        self, ckpt: ShardedCheckpoint, specs: Sequence[TensorSpec], rank: int, world: int
    ) -> None:
        self._ckpt = ckpt
        self._specs = specs
        self._rank = rank
        self._world = world
        self._boxes: dict[tuple[tuple[int, ...], Any], Box] = {}
        self._len = sum(1 for _ in self)

    def __len__(self) -> int:
        return self._len

    def __contains__(self, item: object) -> bool:
        return any(item == row for row in self)

    def __iter__(self) -> Iterator[_Row]:
        for spec in self._specs:
            placement, _ = self._ckpt.placement(spec.name)
            if isinstance(placement, Shard) and spec.shape:
                box = self._boxes.get((spec.shape, placement))
                if box is None:  # the same for every tensor of this shape: a handful in all
                    box, _ = shard_box(
                        spec.shape, (self._world,), (self._rank,), (placement,),
                        where=self._ckpt.path, key=spec.name,
                    )  # fmt: skip
                    self._boxes[spec.shape, placement] = box
                yield _Row(spec.name, spec.dtype, spec.shape, box, f"S{placement.dim}")
            elif self._rank == 0:
                yield _Row(spec.name, spec.dtype, spec.shape, whole(spec.shape), "R")


def _part_lines(meta: Mapping[str, Any], rows: Collection[_Row]) -> Iterator[bytes]:
    head = json.dumps(dict(meta)).encode()  # one line: json.dumps escapes newlines
    yield head[:-1] + _TENSORS_OPEN
    last = len(rows) - 1
    for i, row in enumerate(rows):
        yield json.dumps(row.to_json()).encode() + (b",\n" if i < last else b"\n")
    yield _TENSORS_CLOSE


def _write_kind(
    directory: Path,
    kind: str,
    rank: int,
    world_size: int,
    *,
    rows: Collection[_Row],
    produce: Callable[[_Row], Iterable[Segment]],
    extras: Mapping[str, Any],
    tag: str | None,
    durable: bool,
    algorithm: str,
) -> tuple[Path, Path, dict[str, Any]]:
    """Write one rank's data file, then its index part (both atomically).

    ``rows`` is iterated several times (header, data, index part). Returns the two paths and the
    rank's entry for the merged index.
    """
    name = data_file_name(kind, world_size, rank)
    specs = _LocalSpecs(rows)

    def pieces() -> Iterator[Segment | bytes]:
        yield from iter_header(specs, _METADATA)
        for row in rows:
            yield from produce(row)

    size, digest = _write_atomic(directory / name, pieces(), durable=durable, algorithm=algorithm)
    meta = {
        "format": FORMAT,
        "kind": kind,
        "world_size": world_size,
        "rank": rank,
        "tag": tag,
        "file": name,
        "size": size,
        "hash_algorithm": algorithm,
        "digest": digest,
        "extras": dict(extras),
    }
    part = directory / part_file_name(kind, world_size, rank)
    # Written after the data file is in place: a part on disk vouches for its data.
    _, part_sha = _write_atomic(part, _part_lines(meta, rows), durable=durable)
    listed = {"rank": rank, "index": part.name, "index_sha256": part_sha, "file": name}
    return directory / name, part, listed | {k: meta[k] for k in _CHECKSUM}


def _optimizer_entries(optimizer: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """An optimizer state dict as flat ``{param}.{field}`` tensors plus JSON extras."""
    state = optimizer.get("state")
    groups = optimizer.get("param_groups")
    if not isinstance(state, Mapping) or not isinstance(groups, list):
        raise ConsolidationError(
            "optimizer state must be a state dict with 'state' and 'param_groups' "
            "(as optimizer.state_dict() or get_optimizer_state_dict() give)"
        )
    tensors: dict[str, Any] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for param, fields in cast(Mapping[Any, Mapping[str, Any]], state).items():
        for field_name, value in fields.items():
            if isinstance(value, torch.Tensor | LocalShard):
                tensors[f"{param}.{field_name}"] = value
            else:
                scalars.setdefault(str(param), {})[field_name] = _jsonable(
                    value, f"optimizer state {param}.{field_name}"
                )
    extras = {
        "param_groups": _jsonable(groups, "optimizer param_groups"),
        "state": scalars,
        "param_keys": "int"
        if any(isinstance(k, int) for k in cast(Mapping[Any, Any], state))
        else "str",
    }
    return tensors, extras


def write_rank_shards(
    state: Mapping[str, Any],
    out_dir: Path | str,
    rank: int,
    world_size: int,
    *,
    optimizer: Mapping[str, Any] | None = None,
    lora_only: bool = True,
    tag: str | None = None,
    durable: bool = True,
    hash_algorithm: str = AUTO,
) -> RankShardsResult:
    """Write this rank's local shards (and optimizer state) in the project's shard format.

    Called on every rank with its own ``model.state_dict()``: nothing is gathered and no
    collective runs. DTensor values are stored as their local shard with the region FSDP2 gives
    this rank; :class:`LocalShard` values as given; plain tensors are taken to be replicated and
    stored by rank 0 only. Tensors may live on any device: each is copied to CPU on its own.

    Args:
        state: The rank's model state dict.
        out_dir: The checkpoint directory (created if missing), shared by all ranks.
        rank: This process's global rank.
        world_size: Number of ranks writing.
        optimizer: The optimizer state dict (``get_optimizer_state_dict(model, optim)`` gives
            parameter names as keys; ``optim.state_dict()``'s integer keys work too). Its
            tensors (``exp_avg``, ``exp_avg_sq``, ``step``, ...) are stored as ``{param}.{field}``
            in the ``optim`` files, ``param_groups`` and non-tensor state in the index part.
        lora_only: Keep only the LoRA entries of ``state``.
        tag: A label every rank of one save must share (a step number, a run id); readers
            refuse parts with different tags.
        durable: Fsync files and directories.
        hash_algorithm: The checksum each part records for its data file, computed as it is
            written: ``sha256``, ``xxh3-128`` or ``auto`` (``xxh3-128`` when ``xxhash`` is
            installed).

    Returns:
        The files written and how much.

    Raises:
        ConsolidationError: A value is not a tensor, sits on a mesh of another world size, or
            a non-tensor value is not JSON-serialisable.
    """
    started = time.perf_counter()
    algorithm = resolve(hash_algorithm)
    if not 0 <= rank < world_size:
        raise ConsolidationError(f"rank {rank} is outside world size {world_size}")
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    kinds: list[tuple[str, Mapping[str, Any], dict[str, Any]]] = []
    model = {k: v for k, v in state.items() if not lora_only or keys.adapter_name_of(k) is not None}
    model_tensors = {k: v for k, v in model.items() if isinstance(v, torch.Tensor | LocalShard)}
    model_extras = {
        k: _jsonable(v, f"state entry {k!r}") for k, v in model.items() if k not in model_tensors
    }
    kinds.append(("model", model_tensors, model_extras))
    if optimizer is not None:
        kinds.append(("optim", *_optimizer_entries(optimizer)))
    files: list[Path] = []
    tensors = 0
    written = 0
    for kind, entries, extras in kinds:
        rows: list[_Row] = []
        locals_: dict[str, torch.Tensor] = {}
        meshes: dict[int, Any] = {}
        for key, value in entries.items():
            got = _local_row(key, value, rank, world_size, where=directory, meshes=meshes)
            if got is not None:
                rows.append(got[0])
                locals_[key] = got[1]

        def produce(row: _Row, locals_: dict[str, torch.Tensor] = locals_) -> Iterator[Segment]:
            local = locals_[row.name].detach()
            yield tensor_bytes(local if local.device.type == "cpu" else local.cpu())

        data, part, listed = _write_kind(
            directory,
            kind,
            rank,
            world_size,
            rows=rows,
            produce=produce,
            extras=extras,
            tag=tag,
            durable=durable,
            algorithm=algorithm,
        )
        files += [data, part]
        tensors += len(rows)
        written += listed["size"]
    return RankShardsResult(tuple(files), tensors, written, time.perf_counter() - started)


# ----------------------------------------------------------------------------------- reading


def find_shards(path: Path, kind: str = "model") -> tuple[Path, list[int]]:
    """The directory (``path`` or its ``policy/``) holding ``kind`` shards, and their world sizes."""
    for directory in (path, path / "policy"):
        if not directory.is_dir():
            continue
        sizes: set[int] = set()
        for p in directory.iterdir():
            m = _PART_RE.match(p.name) or _INDEX_RE.match(p.name)
            if m and m.group(1) == kind:
                sizes.add(int(m.group(2)))
        if sizes:
            return directory, sorted(sizes)
    return path, []


def has_shards(path: Path) -> bool:
    """Whether ``path`` (or its ``policy/``) holds a model checkpoint in this format."""
    return bool(find_shards(path)[1])


def _load_json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise ShardError(path, f"cannot read index ({exc})") from exc
    if not isinstance(doc, dict):
        raise ShardError(path, "index is not a JSON object")
    return cast(dict[str, Any], doc)


def _read_part(path: Path) -> tuple[dict[str, Any], Iterator[Any], Any]:
    """A part's metadata, an iterator over its rows, and the file's sha256 (being computed).

    The digest is complete once the rows are exhausted. Rows are parsed one line at a time when
    the part has the writer's layout; any other layout is parsed whole.
    """
    digest = hashlib.sha256()
    f: Any = path.open("rb")
    try:
        first = f.readline()
        digest.update(first)
        meta: Any = None
        if first.endswith(_TENSORS_OPEN):
            try:
                meta = json.loads(first[: -len(_TENSORS_OPEN)] + b"}")
            except ValueError:
                meta = None
        if isinstance(meta, dict):
            rows = _part_rows(f, path, digest)  # closes the file when done
            f = None
            return cast(dict[str, Any], meta), rows, digest
        rest = f.read()
    finally:
        if f is not None:
            f.close()
    digest.update(rest)
    try:
        doc = json.loads(first + rest)
    except ValueError as exc:
        raise ShardError(path, f"index part is not valid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise ShardError(path, "index part is not a JSON object")
    rows_list: Any = cast(dict[str, Any], doc).pop("tensors", None)
    if not isinstance(rows_list, list):
        raise ShardError(path, "index part has no tensor list")
    return cast(dict[str, Any], doc), iter(cast(list[Any], rows_list)), digest


def _part_rows(f: Any, path: Path, digest: Any) -> Iterator[Any]:
    with f:
        for line in f:
            digest.update(line)
            if line == _TENSORS_CLOSE:
                rest = f.read()
                digest.update(rest)
                if rest.strip():
                    raise ShardError(path, "index part has data after its tensor list")
                return
            try:
                yield json.loads(line.rstrip(b"\n").rstrip(b","))
            except ValueError as exc:
                raise ShardError(path, f"malformed index row {line[:200]!r} ({exc})") from exc
    raise ShardError(path, "index part ends inside its tensor list (truncated?)")


class ShardsCheckpoint(ShardedCheckpoint):
    """A checkpoint in the project's shard format, read through its index (no unpickling).

    Everything is checked before any tensor byte is read: every rank's index part and data file
    is present (and matches the merged index, if there is one), the data file has the size its
    part records, its safetensors header agrees with the index (names, dtypes, shapes, byte
    ranges inside the file), and the regions of every tensor tile it exactly (no overlap, no
    gap). Rows are kept as a compact table: per tensor its spec, per rank and tensor the region
    (tuples shared between tensors) and the file offset.
    """

    kind = "shards"

    def __init__(
        self, path: Path | str, world_size: int | None = None, *, kind: str = "model"
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.state_kind = kind
        self.path, sizes = find_shards(Path(path), kind)
        if not sizes:
            raise ShardError(self.path, f"no {kind}_world_size_W_rank_R.index.json files found")
        if world_size is None:
            if len(sizes) > 1:
                raise ShardError(
                    self.path,
                    f"{kind} shards of several world sizes {sizes} side by side; "
                    "choose one with world_size",
                )
            world_size = sizes[0]
        elif world_size not in sizes:
            raise ShardError(
                self.path, f"no {kind} shards for world size {world_size} (found {sizes})"
            )
        self.world_size = world_size
        self.tag: str | None = None
        self.files: list[Path] = []
        self._fds: list[int] = []
        self._extras: dict[str, Any] = {}
        self._index: dict[str, int] = {}
        self._specs: list[TensorSpec] = []
        self._placements: list[str] = []
        self._pos: list[array[int]] = [array("l") for _ in range(world_size)]
        self._rows: list[array[int]] = [array("l") for _ in range(world_size)]
        self._boxes: list[list[Box]] = [[] for _ in range(world_size)]
        self._offsets: list[array[int]] = [array("q") for _ in range(world_size)]
        self._shared: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._shared_boxes: dict[Box, Box] = {}
        try:
            listed = self._merged(world_size)
            missing = [r for r in range(world_size) if not self._part_path(r).is_file()]
            if missing:
                names = ", ".join(p.name for p in map(self._part_path, missing))
                raise ShardError(
                    self._part_path(missing[0]),
                    f"missing rank(s) {missing} of world size {world_size}: {names}",
                )
            for rank in range(world_size):
                self._read_rank(rank, listed[rank] if listed else None)
            if listed is not None and len(self._specs) != listed[0].get("tensors"):
                raise ShardError(self.path, "the merged index counts other tensors than the parts")
            for t, spec in enumerate(self._specs):
                _check_tiling(self.path, spec.name, spec.shape, self._pieces(t), self.files)
        except BaseException:
            self.close()
            raise

    def _part_path(self, rank: int) -> Path:
        return self.path / part_file_name(self.state_kind, cast(int, self.world_size), rank)

    def _merged(self, world: int) -> list[dict[str, Any]] | None:
        path = self.path / index_file_name(self.state_kind, world)
        if not path.is_file():
            return None
        doc = _load_json(path)
        ranks: Any = doc.get("ranks")
        if doc.get("format") != FORMAT or doc.get("kind") != self.state_kind:
            raise ShardError(path, f"not a {FORMAT} {self.state_kind} index")
        if not isinstance(ranks, list) or len(cast(list[Any], ranks)) != world:
            raise ShardError(path, f"does not list the {world} ranks")
        listed = [
            cast(dict[str, Any], r) if isinstance(r, dict) else {} for r in cast(list[Any], ranks)
        ]
        for entry in listed:
            entry["tensors"] = doc.get("tensors")
            entry["tag"] = doc.get("tag")
        return listed

    def _read_rank(self, rank: int, listed: dict[str, Any] | None) -> None:
        world = cast(int, self.world_size)
        where = self._part_path(rank)
        meta, rows, digest = _read_part(where)
        self._check_meta(meta, rank, where)
        path = self.path / data_file_name(self.state_kind, world, rank)
        self.files.append(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ShardError(path, f"data file of rank {rank} is missing") from None
        self._fds.append(fd)
        size = os.fstat(fd).st_size
        if size != meta.get("size"):
            raise ShardError(
                path,
                f"{size} bytes on disk, the index records {meta.get('size')} "
                "(truncated or replaced?)",
            )
        # The header this rank's rows give, as the writer lays it out: hashed, not held.
        expected = hashlib.sha256(b"{" + meta_piece(_METADATA))
        length = 2 + len(meta_piece(_METADATA))
        relative: list[int] = []
        end = 0
        for i, raw in enumerate(rows):
            t, box = self._add(raw, rank, where)
            spec = TensorSpec(self._specs[t].name, box[1], self._specs[t].dtype)
            piece = b"," + entry_piece(spec, end)
            expected.update(piece)
            length += len(piece)
            relative.append(end)
            self._rows[rank].append(t)
            self._boxes[rank].append(box)
            self._pos[rank][t] = i
            end += spec.nbytes
        if listed is not None:
            _check_listed(listed, meta, digest.hexdigest(), rank, where)
        pad = -length % 8
        expected.update(b"}" + b" " * pad)
        head = os.pread(fd, 8, 0)
        (n,) = struct.unpack("<Q", head) if len(head) == 8 else (-1,)
        if n < 0 or 8 + n > size:
            raise ShardError(path, "the safetensors header runs past the end (truncated?)")
        if n != length + pad or _hash_range(fd, 8, n) != expected.digest():
            # Not the writer's layout, or wrong: compare entry by entry (and say what differs).
            relative = self._check_header(rank, fd, size, path)
            start = 0
        else:
            start = 8 + n
        if start + end > size and start:
            raise ShardError(
                path, f"tensor data runs past the end of the file ({size} bytes; truncated?)"
            )
        self._offsets[rank] = array("q", (start + r for r in relative))

    def _check_meta(self, meta: dict[str, Any], rank: int, where: Path) -> None:
        world = cast(int, self.world_size)
        if rank == 0:
            self.tag = meta.get("tag")
            extras: Any = meta.get("extras")
            self._extras = dict(cast(dict[str, Any], extras)) if isinstance(extras, dict) else {}
        expect = {
            "format": FORMAT,
            "kind": self.state_kind,
            "world_size": world,
            "rank": rank,
            "file": data_file_name(self.state_kind, world, rank),
        }
        for field_name, value in expect.items():
            if meta.get(field_name) != value:
                raise ShardError(
                    where, f"index says {field_name}={meta.get(field_name)!r}, expected {value!r}"
                )
        if meta.get("tag") != self.tag:
            raise ShardError(
                where,
                f"tag {meta.get('tag')!r} differs from rank 0's {self.tag!r} "
                "(rank files from different saves)",
            )

    def _share(self, values: Any) -> tuple[int, ...]:
        t = tuple(int(v) for v in values)
        return self._shared.setdefault(t, t)

    def _share_box(self, offsets: Any, sizes: Any) -> Box:
        # Thousands of rows hold a handful of distinct regions: keep one tuple of each.
        box = (self._share(offsets), self._share(sizes))
        return self._shared_boxes.setdefault(box, box)

    def _add(self, raw: Any, rank: int, where: Path) -> tuple[int, Box]:
        """Check one index row and register it; returns its tensor and this rank's region."""
        try:
            name, dtype_name, shape, offsets, sizes, placement = raw
            dtype = DTYPES_BY_NAME[dtype_name]
            shape_t = self._share(shape)
            box = self._share_box(offsets, sizes)
        except (ValueError, TypeError, KeyError) as exc:
            raise ShardError(where, f"malformed index row {str(raw)[:200]} ({exc})") from exc
        name = str(name)
        if not (len(box[0]) == len(box[1]) == len(shape_t)) or any(
            o < 0 or s < 0 or o + s > g for o, s, g in zip(*box, shape_t, strict=True)
        ):
            raise ShardError(
                where,
                f"region at {list(box[0])} size {list(box[1])} lies outside {list(shape_t)}",
                key=name,
            )
        if placement != "R" and not (
            isinstance(placement, str) and placement[:1] == "S" and placement[1:].isdigit()
        ):
            raise ShardError(where, f"unknown placement {placement!r}", key=name)
        t = self._index.get(name)
        if t is None:
            t = self._index[name] = len(self._specs)
            self._specs.append(TensorSpec(name, shape_t, dtype))
            self._placements.append(str(placement))
            for pos in self._pos:
                pos.append(-1)
            return t, box
        spec = self._specs[t]
        if (dtype, shape_t, placement) != (spec.dtype, spec.shape, self._placements[t]):
            raise ShardError(
                where,
                f"{dtype} {list(shape_t)} {placement} disagrees with another rank's "
                f"{spec.dtype} {list(spec.shape)} {self._placements[t]}",
                key=name,
            )
        if self._pos[rank][t] >= 0:
            raise ShardError(where, "tensor listed twice", key=name)
        return t, box

    def _check_header(self, rank: int, fd: int, size: int, path: Path) -> list[int]:
        """Compare the file's parsed header with the rank's rows; their absolute offsets."""
        start, header = read_header(fd, size, path)
        names = {self._specs[t].name for t in self._rows[rank]}
        extra = sorted(set(header) - names)
        if extra:
            raise ShardError(path, "tensor in the file but not in the index", key=extra[0])
        offsets: list[int] = []
        for t, box in zip(self._rows[rank], self._boxes[rank], strict=True):
            spec = self._specs[t]
            info: Any = header.get(spec.name)
            if not isinstance(info, dict):
                raise ShardError(
                    path, "tensor in the index is missing from the file", key=spec.name
                )
            info = cast(dict[str, Any], info)
            want = safetensors_dtype(spec.dtype)
            if info.get("dtype") != want:
                raise ShardError(
                    path,
                    f"file holds dtype {info.get('dtype')}, the index says {want}",
                    key=spec.name,
                )
            if info.get("shape") != list(box[1]):
                raise ShardError(
                    path,
                    f"file holds shape {info.get('shape')}, the index says {list(box[1])}",
                    key=spec.name,
                )
            begin, end = cast(list[int], info.get("data_offsets") or [0, -1])
            nbytes = math.prod(box[1]) * spec.dtype.itemsize
            if end - begin != nbytes or begin < 0:
                raise ShardError(
                    path, f"byte range {[begin, end]} is not {nbytes} bytes", key=spec.name
                )
            if start + end > size:
                raise ShardError(
                    path,
                    f"tensor data runs past the end of the file ({size} bytes; truncated?)",
                    key=spec.name,
                )
            offsets.append(start + begin)
        return offsets

    def _pieces(self, t: int) -> list[Piece]:
        pieces: list[Piece] = []
        for rank, pos in enumerate(self._pos):
            i = pos[t]
            if i >= 0:
                box = self._boxes[rank][i]
                if math.prod(box[1]):
                    pieces.append(
                        Piece(box, self._fds[rank], self.files[rank], self._offsets[rank][i])
                    )
        return pieces

    def specs(self) -> list[TensorSpec]:
        return list(self._specs)

    def extras(self) -> dict[str, Any]:
        return dict(self._extras)

    def placement(self, name: str) -> tuple[Any | None, str]:
        return _placement_of(self._placements[self._index[name]]), "cpu"

    def segments(self, name: str, box: Box | None = None) -> list[Segment]:
        t = self._index[name]
        spec = self._specs[t]
        return _plan.segments(name, spec.dtype.itemsize, box or whole(spec.shape), self._pieces(t))

    def read(self, name: str, box: Box | None = None) -> torch.Tensor:
        spec = self._specs[self._index[name]]
        box = box or whole(spec.shape)
        data = _plan.gather(name, self.segments(name, box), math.prod(box[1]) * spec.dtype.itemsize)
        return tensor_from_bytes(data, spec.dtype, box[1])

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        self._index, self._specs, self._placements = {}, [], []
        self._pos, self._rows, self._boxes, self._offsets = [], [], [], []


@functools.cache
def _placement_of(placement: str) -> Any:
    return Replicate() if placement == "R" else Shard(int(placement[1:]))


def _check_listed(
    listed: dict[str, Any], meta: dict[str, Any], part_sha: str, rank: int, where: Path
) -> None:
    """A part must be the one the merged index vouched for."""
    if listed.get("index_sha256") != part_sha:
        raise ShardError(where, "index part differs from the one the merged index lists")
    for field_name in ("file", "size", *_CHECKSUM):
        if listed.get(field_name) != meta.get(field_name):
            raise ShardError(
                where, f"{field_name} {meta.get(field_name)!r} differs from the merged index"
            )
    if listed.get("rank") != rank:
        raise ShardError(where, f"the merged index lists rank {listed.get('rank')!r} here")


def _hash_range(fd: int, offset: int, nbytes: int) -> bytes:
    digest = hashlib.sha256()
    while nbytes > 0:
        chunk = os.pread(fd, min(nbytes, 1 << 20), offset)
        if not chunk:
            break
        digest.update(chunk)
        offset += len(chunk)
        nbytes -= len(chunk)
    return digest.digest()


def _rank_of(piece: Piece, files: list[Path]) -> int:
    return files.index(piece.path)


def _check_tiling(
    where: Path, name: str, shape: tuple[int, ...], pieces: list[Piece], files: list[Path]
) -> None:
    """Raise unless the non-empty ``pieces`` cover ``shape`` exactly once."""
    total = math.prod(shape)
    if not pieces:
        if total:
            raise ShardError(where, f"no rank holds any of this {list(shape)} tensor", key=name)
        return
    # The usual case: pieces differ along one dim only; sort along it and walk.
    full = [d for d in range(len(shape)) if all(p.box[1][d] == shape[d] for p in pieces)]
    split = [d for d in range(len(shape)) if d not in full]
    if len(split) <= 1:
        dim = split[0] if split else 0
        ordered = sorted(pieces, key=lambda p: p.box[0][dim] if shape else 0)
        pos = 0
        for p in ordered:
            start = p.box[0][dim] if shape else 0
            size = p.box[1][dim] if shape else 1
            if start > pos:
                raise ShardError(
                    where,
                    f"regions leave a gap: rows {pos}..{start} of dim {dim} are held by no rank",
                    key=name,
                )
            if start < pos:
                raise ShardError(
                    where,
                    f"regions overlap: rank {_rank_of(p, files)} holds dim {dim} from {start}, "
                    f"another rank up to {pos}",
                    key=name,
                )
            pos = start + size
        end = shape[dim] if shape else 1
        if pos != end:
            raise ShardError(
                where, f"regions leave a gap: rows {pos}..{end} of dim {dim} are held by no rank",
                key=name,
            )  # fmt: skip
        return
    for i, a in enumerate(pieces):
        for b in pieces[i + 1 :]:
            if _plan.intersect(a.box, b.box) is not None:
                raise ShardError(
                    where,
                    f"regions overlap: ranks {_rank_of(a, files)} and {_rank_of(b, files)}",
                    key=name,
                )
    covered = sum(_plan.volume(p.box) for p in pieces)
    if covered != total:
        raise ShardError(
            where, f"regions leave a gap: {covered} of {total} elements are held", key=name
        )


def verify_rank_shards(out_dir: Path | str, world_size: int, *, kind: str = "model") -> list[Path]:
    """Re-hash every rank's data file and compare it with the size and checksum its part records.

    Consolidation checks headers, sizes and tiling, not the tensor bytes; a reader that must
    never publish a corrupted adapter (bit rot, a torn copy) calls this first. It reads each data
    file once. Returns the data files checked.

    Raises:
        ShardError: A part or data file is missing, or a data file's bytes differ from what its
            rank wrote.
    """
    from lora_consolidate._hashing import new_hasher

    directory = Path(out_dir)
    checked: list[Path] = []
    for rank in range(world_size):
        part = directory / part_file_name(kind, world_size, rank)
        if not part.is_file():
            raise ShardError(part, f"missing rank {rank} of world size {world_size}")
        meta, _rows, _digest = _read_part(part)
        data = directory / str(meta.get("file", data_file_name(kind, world_size, rank)))
        try:
            size = data.stat().st_size
        except FileNotFoundError:
            raise ShardError(data, f"rank {rank}'s data file is missing") from None
        if size != meta.get("size"):
            raise ShardError(data, f"{size} bytes, but rank {rank} wrote {meta.get('size')}")
        hasher = new_hasher(str(meta.get("hash_algorithm", SHA256)))
        with data.open("rb") as f:
            while chunk := f.read(1 << 20):
                hasher.update(chunk)
        if hasher.hexdigest() != meta.get("digest"):
            raise ShardError(
                data, f"checksum differs from the one rank {rank} recorded (corrupt or torn)"
            )
        checked.append(data)
    return checked


def finalize_rank_shards(
    out_dir: Path | str, world_size: int, *, durable: bool = True
) -> list[Path]:
    """Check every rank's files together and write the merged index (rank 0, after a barrier).

    The merged index lists each rank's index part (sha256) and data file (size, checksum),
    written only after the parts were checked to agree and to tile every tensor: its presence
    says the save is complete. Returns the merged index files written, one per kind present.

    Raises:
        ShardError: A rank's files are missing or disagree with the others (nothing is written).
    """
    directory = Path(out_dir)
    done: list[tuple[str, str | None, int, list[dict[str, Any]]]] = []
    for kind in KINDS:
        if not any(
            (directory / part_file_name(kind, world_size, r)).is_file() for r in range(world_size)
        ):
            continue
        merged = directory / index_file_name(kind, world_size)
        merged.unlink(missing_ok=True)  # rebuilt from the parts below
        with ShardsCheckpoint(directory, world_size, kind=kind) as ckpt:  # checks everything
            count = len(ckpt.specs())
            tag = ckpt.tag
        ranks: list[dict[str, Any]] = []
        for rank in range(world_size):
            part = directory / part_file_name(kind, world_size, rank)
            meta, rows, digest = _read_part(part)
            for _ in rows:  # the digest is complete once the rows are read
                pass
            listed = {"rank": rank, "index": part.name, "index_sha256": digest.hexdigest()}
            ranks.append(listed | {k: meta.get(k) for k in ("file", *_CHECKSUM)})
        done.append((kind, tag, count, ranks))
    if not done:
        raise ShardError(directory, f"no shards of world size {world_size} to finalize")
    return [
        _write_merged(
            directory, kind, world_size, tag=tag, count=count, ranks=ranks, durable=durable
        )
        for kind, tag, count, ranks in done
    ]


def _write_merged(
    directory: Path,
    kind: str,
    world_size: int,
    *,
    tag: str | None,
    count: int,
    ranks: list[dict[str, Any]],
    durable: bool,
) -> Path:
    path = directory / index_file_name(kind, world_size)
    doc = {
        "format": FORMAT,
        "kind": kind,
        "world_size": world_size,
        "tag": tag,
        "tensors": count,
        "ranks": ranks,
    }
    fs.atomic_write_json(path, doc, durable=durable)
    return path


# ----------------------------------------------------------------------------------- loading


def _target_box(value: DTensor, key: str, where: Path) -> Box:
    mesh = value.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ConsolidationError(f"{where}: this rank is not in the device mesh of {key!r}")
    box, _ = shard_box(
        tuple(value.shape), tuple(mesh.shape), coordinate, value.placements, where=where, key=key
    )
    return box


def _load_into(ckpt: ShardsCheckpoint, template: Mapping[str, Any]) -> dict[str, Any]:
    specs = {s.name: s for s in ckpt.specs()}
    out: dict[str, Any] = {}
    for key, value in template.items():
        spec = specs.get(key)
        if spec is None or not isinstance(value, torch.Tensor):
            continue
        if (tuple(value.shape), value.dtype) != (spec.shape, spec.dtype):
            raise ShardError(
                ckpt.path,
                f"checkpoint holds {spec.dtype} {list(spec.shape)}, the model "
                f"{value.dtype} {list(value.shape)}",
                key=key,
            )
        if isinstance(value, DTensor):
            box = _target_box(value, key, ckpt.path)
            local = ckpt.read(key, box).to(value.to_local().device)
            out[key] = DTensor.from_local(
                local,
                value.device_mesh,
                value.placements,
                run_check=False,
                shape=value.shape,
                stride=value.stride(),
            )
        else:
            out[key] = ckpt.read(key).to(value.device)
    return out


def _restore_group(group: Mapping[str, Any]) -> dict[str, Any]:
    # JSON has no tuples; torch's optimizers keep hyperparameter pairs (betas) as tuples.
    return {
        k: tuple(cast(list[Any], v)) if isinstance(v, list) and k != "params" else v
        for k, v in group.items()
    }


def load_rank_shards(
    checkpoint: Path | str,
    state: Mapping[str, Any],
    *,
    optimizer: Mapping[str, Any] | None = None,
    world_size: int | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Read this rank's part of a shard-format checkpoint, saved at any world size.

    ``state`` is the rank's own ``model.state_dict()`` (DTensors on the current mesh): each of
    its entries the checkpoint holds comes back as a DTensor of the same mesh and placements
    whose local shard is read from the checkpoint (only the bytes this rank needs). With
    ``optimizer`` (the live ``get_optimizer_state_dict(model, optim)``, which initialises the
    state), the saved optimizer state comes back in the same form, ``param_groups`` included.
    Pass the results to ``model.load_state_dict(..., strict=False)`` and
    ``set_optimizer_state_dict``.

    Raises:
        ShardError: The checkpoint is incomplete or inconsistent, or a tensor's shape or dtype
            differs from the model's.
        ConsolidationError: ``optimizer`` is given but the checkpoint holds no optimizer state.
    """
    with ShardsCheckpoint(checkpoint, world_size) as ckpt:
        model = _load_into(ckpt, state)
    if optimizer is None:
        return model, None
    path = Path(checkpoint)
    try:
        optim_ckpt = ShardsCheckpoint(path, world_size, kind="optim")
    except ShardError as exc:
        raise ConsolidationError(f"{path}: no optimizer state to load ({exc})") from exc
    with optim_ckpt:
        flat, _ = _optimizer_entries(optimizer)
        loaded = _load_into(optim_ckpt, flat)
        extras = optim_ckpt.extras()
    int_keys = extras.get("param_keys") == "int"
    nested: dict[Any, dict[str, Any]] = {}
    for name, value in loaded.items():
        param, field_name = name.rsplit(".", 1)
        nested.setdefault(int(param) if int_keys else param, {})[field_name] = value
    for param, fields in cast(dict[str, dict[str, Any]], extras.get("state") or {}).items():
        nested.setdefault(int(param) if int_keys else param, {}).update(fields)
    groups = [
        _restore_group(g) for g in cast(list[dict[str, Any]], extras.get("param_groups") or [])
    ]
    return model, {"state": nested, "param_groups": groups}


# ----------------------------------------------------------------------------------- reshard


def reshard_to_shards(
    model: ShardedCheckpoint,
    staging: Path,
    world_size: int,
    *,
    lora_only: bool,
    optimizer: bool = False,
    durable: bool = True,
    hash_algorithm: str = AUTO,
) -> int:
    """Write ``model`` (and, if ``optimizer``, its optimizer state) for ``world_size`` ranks.

    Each target rank's file is streamed region by region from the source shards into
    ``staging``; the optimizer state is opened only once the model is written. Returns the
    number of tensors per rank set.
    """
    count = 0
    algorithm = resolve(hash_algorithm)
    for kind in ("model", "optim") if optimizer else ("model",):
        ckpt = (
            model if kind == "model" else ShardsCheckpoint(model.path, model.world_size, kind=kind)
        )
        specs = [
            s
            for s in ckpt.specs()
            if kind != "model" or not lora_only or keys.adapter_name_of(s.name) is not None
        ]
        if not specs:
            raise ConsolidationError(f"{ckpt.path}: nothing to reshard")
        count += len(specs)
        tag = getattr(ckpt, "tag", None)
        extras = _jsonable(ckpt.extras(), f"{ckpt.path}: non-tensor entries")
        listed: list[dict[str, Any]] = []
        for rank in range(world_size):
            rows = _TargetRows(ckpt, specs, rank, world_size)

            def produce(row: _Row, ckpt: ShardedCheckpoint = ckpt) -> Iterator[Segment]:
                yield from ckpt.segments(row.name, row.box)

            _, _, entry = _write_kind(
                staging,
                kind,
                rank,
                world_size,
                rows=rows,
                produce=produce,
                extras=extras,
                tag=tag,
                durable=durable,
                algorithm=algorithm,
            )
            listed.append(entry)
        ckpt.close()  # the model's tables too: only one kind's index is held at a time
        # Every region was computed here, so the parts tile each tensor by construction.
        _write_merged(
            staging, kind, world_size, tag=tag, count=len(specs), ranks=listed, durable=durable
        )
    return count
