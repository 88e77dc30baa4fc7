"""Which bytes of which shard files make up a region of a tensor, in row-major output order.

A shard is a contiguous row-major block of bytes in its file. Where a region of the output and
the shards it draws on line up (FSDP shards dim 0, so every piece of a LoRA matrix is one run of
rows), the region is a short list of file ranges that can be copied as they are. Otherwise
(a shard on dim 1, or runs too short to be worth a read each) the region is assembled in memory.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lora_consolidate.errors import ShardError

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, sizes)

# Below this a run is not worth one read: assemble in memory instead of row by row.
MIN_RUN_BYTES = 4096
MAX_RUNS = 256


@dataclass(frozen=True, slots=True)
class Piece:
    """``box`` of a global tensor, stored row-major at ``offset`` of the open file ``fd``."""

    box: Box
    fd: int
    path: Path
    offset: int


@dataclass(frozen=True, slots=True)
class FileRange:
    """``nbytes`` of the open file ``fd`` from ``offset``."""

    fd: int
    path: Path
    offset: int
    nbytes: int


Segment = FileRange | memoryview


def volume(box: Box) -> int:
    """Number of elements in ``box``."""
    return math.prod(box[1])


def whole(shape: Sequence[int]) -> Box:
    """The box covering all of a tensor of ``shape``."""
    return tuple(0 for _ in shape), tuple(shape)


def intersect(a: Box, b: Box) -> Box | None:
    """The common region of two boxes, or None if it is empty."""
    offsets: list[int] = []
    sizes: list[int] = []
    for ao, asz, bo, bsz in zip(a[0], a[1], b[0], b[1], strict=True):
        lo, hi = max(ao, bo), min(ao + asz, bo + bsz)
        if hi <= lo:
            return None
        offsets.append(lo)
        sizes.append(hi - lo)
    return tuple(offsets), tuple(sizes)


def slices(box: Box, origin: Sequence[int]) -> tuple[slice, ...]:
    """``box`` as slices of an array whose first element sits at ``origin``."""
    return tuple(slice(o - base, o - base + s) for o, s, base in zip(*box, origin, strict=True))


def _strides(sizes: Sequence[int]) -> list[int]:
    strides = [1] * len(sizes)
    for d in range(len(sizes) - 2, -1, -1):
        strides[d] = strides[d + 1] * sizes[d + 1]
    return strides


def _runs(piece: Piece, part: Box, box: Box, itemsize: int) -> list[tuple[int, int, int]] | None:
    """(destination offset, source offset, bytes) runs copying ``part`` from piece to box."""
    psz, bsz = piece.box[1], box[1]
    isz = part[1]
    j = len(isz)
    run = 1
    while j > 0:
        j -= 1
        run *= isz[j]
        if not isz[j] == psz[j] == bsz[j]:
            break
    outer = isz[:j]
    count = math.prod(outer)
    if count > 1 and (count > MAX_RUNS or run * itemsize < MIN_RUN_BYTES):
        return None
    pstride, bstride = _strides(psz), _strides(bsz)
    runs: list[tuple[int, int, int]] = []
    for flat in range(count):
        coord = list(part[0])
        rest = flat
        for d in range(j - 1, -1, -1):
            coord[d] += rest % outer[d]
            rest //= outer[d]
        src = sum((c - o) * s for c, o, s in zip(coord, piece.box[0], pstride, strict=True))
        dst = sum((c - o) * s for c, o, s in zip(coord, box[0], bstride, strict=True))
        runs.append((dst * itemsize, piece.offset + src * itemsize, run * itemsize))
    return runs


def _read_exact(fd: int, view: memoryview, offset: int, where: Path, key: str) -> None:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise ShardError(where, "file ends inside tensor data (truncated?)", key=key)
        done += n


def assemble(key: str, itemsize: int, box: Box, pieces: Sequence[Piece]) -> bytearray:
    """``box`` of tensor ``key`` as row-major bytes, copied from every piece it overlaps."""
    out = bytearray(volume(box) * itemsize)
    if not out:
        return out
    target = np.frombuffer(out, dtype=np.uint8).reshape(*box[1], itemsize)
    for piece in pieces:
        part = intersect(piece.box, box)
        if part is None:
            continue
        raw = np.empty(volume(piece.box) * itemsize, dtype=np.uint8)
        _read_exact(piece.fd, memoryview(raw), piece.offset, piece.path, key)
        source = raw.reshape(*piece.box[1], itemsize)
        target[slices(part, box[0])] = source[slices(part, piece.box[0])]
    return out


def _row_ranges(itemsize: int, box: Box, pieces: Sequence[Piece]) -> list[Segment] | None:
    """The common case, fast: box and pieces all whole along every dim but the first."""
    tail = box[1][1:]
    if not box[1] or any(box[0][1:]):
        return None
    for p in pieces:
        if p.box[1][1:] != tail or any(p.box[0][1:]):
            return None
    row = math.prod(tail) * itemsize
    start, stop = box[0][0], box[0][0] + box[1][0]
    out: list[Segment] = []
    pos = start
    for p in sorted(pieces, key=lambda p: p.box[0][0]):
        lo, hi = max(p.box[0][0], pos), min(p.box[0][0] + p.box[1][0], stop)
        if hi <= lo:
            continue
        if lo != pos:
            return None  # not a tiling; let the general path say so
        src = p.offset + (lo - p.box[0][0]) * row
        last = out[-1] if out else None
        if isinstance(last, FileRange) and last.fd == p.fd and last.offset + last.nbytes == src:
            out[-1] = FileRange(p.fd, p.path, last.offset, last.nbytes + (hi - lo) * row)
        else:
            out.append(FileRange(p.fd, p.path, src, (hi - lo) * row))
        pos = hi
    return out if pos == stop else None


def segments(key: str, itemsize: int, box: Box, pieces: Sequence[Piece]) -> list[Segment]:
    """The bytes of ``box`` of tensor ``key`` in row-major order, as file ranges where possible.

    ``pieces`` must tile the tensor without overlap (checked when the checkpoint is opened).
    """
    if not volume(box):
        return []
    fast = _row_ranges(itemsize, box, pieces)
    if fast is not None:
        return fast
    runs: list[tuple[int, int, int, Piece]] = []
    for piece in pieces:
        part = intersect(piece.box, box)
        if part is None or volume(part) == 0:
            continue
        found = _runs(piece, part, box, itemsize)
        if found is None:
            return [memoryview(assemble(key, itemsize, box, pieces))]
        runs.extend((dst, src, n, piece) for dst, src, n in found)
    runs.sort(key=lambda r: r[0])
    out: list[Segment] = []
    expected = 0
    for dst, src, n, piece in runs:
        if dst != expected:  # the pieces were validated to tile the tensor
            raise AssertionError(f"{key}: byte {expected} of {box} is not covered")
        expected += n
        last = out[-1] if out else None
        if isinstance(last, FileRange) and last.fd == piece.fd and last.offset + last.nbytes == src:
            out[-1] = FileRange(piece.fd, piece.path, last.offset, last.nbytes + n)
        else:
            out.append(FileRange(piece.fd, piece.path, src, n))
    if expected != volume(box) * itemsize:
        raise AssertionError(f"{key}: only {expected} bytes of {box} are covered")
    return out


def gather(key: str, parts: Sequence[Segment], nbytes: int) -> bytearray:
    """Concatenate segments into one buffer of ``nbytes``."""
    out = bytearray(nbytes)
    view = memoryview(out)
    pos = 0
    for part in parts:
        if isinstance(part, FileRange):
            _read_exact(part.fd, view[pos : pos + part.nbytes], part.offset, part.path, key)
            pos += part.nbytes
        else:
            view[pos : pos + len(part)] = part.cast("B")
            pos += len(part)
    return out
