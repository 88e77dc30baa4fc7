"""Read shard bytes without faulting in the mmap, and give back pages that were faulted in.

``torch.load(mmap=True)`` gives tensors whose storage lies inside a private mapping of the rank
file; the mapping tells where in the file each tensor's bytes are. Reading them with ``pread``
is much faster than page-faulting through the mapping, and leaves no file pages mapped. When the
offset cannot be known (not Linux, or a strided view) the bytes are copied through the mapping,
and then:

``torch.load(mmap=True)`` maps each rank file privately. Touched pages stay resident (and count
in RSS) until the mapping goes away, so a stream over every tensor would end with RSS equal to the
sum of all shards. ``madvise(MADV_DONTNEED)`` on a private, never-written file mapping just drops
those pages (a later touch re-reads the file). It would zero anonymous memory, so this only acts
on address ranges that /proc/self/maps shows as a mapping of the given file.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from pathlib import Path

import torch

_MADV_DONTNEED = 4
_PAGE = mmap.PAGESIZE
# Page faults map in neighbouring cached pages too ("fault-around", 64 KiB by default), so pages
# of tensors released earlier come back when the next one is read; release a margin around each.
_MARGIN = 1 << 20


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


Mapping = tuple[int, int, int]  # (start address, end address, file offset of start)


def file_mappings(path: Path) -> list[Mapping]:
    """Address ranges of this process that map ``path`` (empty off Linux)."""
    if _LIBC is None:
        return []
    target = str(path.resolve())
    ranges: list[Mapping] = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].rstrip("\n") == target:
                    start, end = fields[0].split("-")
                    ranges.append((int(start, 16), int(end, 16), int(fields[2], 16)))
    except OSError:
        return []
    return ranges


def file_offset(tensor: torch.Tensor, mappings: list[Mapping]) -> int | None:
    """Offset in the mapped file of a contiguous tensor's first byte, if it lives in a mapping."""
    if not mappings or not tensor.is_contiguous():
        return None
    begin = tensor.data_ptr()
    end = begin + tensor.numel() * tensor.element_size()
    for map_start, map_end, map_offset in mappings:
        if map_start <= begin and end <= map_end:
            return begin - map_start + map_offset
    return None


def _advise(tensor: torch.Tensor, mappings: list[Mapping], advice: int, margin: int) -> None:
    if _LIBC is None or not mappings:
        return
    storage = tensor.untyped_storage()
    begin = storage.data_ptr()
    end = begin + storage.nbytes()
    for map_start, map_end, _ in mappings:
        if map_start <= begin and end <= map_end:
            lo, hi = begin - margin, end + margin
            start = max(map_start, lo - lo % _PAGE)
            stop = min(map_end, hi + (-hi % _PAGE))
            if stop > start:
                # Advice only: a failure (old kernel, EINVAL) just leaves things as they were.
                _LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(stop - start), advice)
            return


def release(tensor: torch.Tensor, mappings: list[Mapping]) -> None:
    """Drop the resident pages behind ``tensor`` if (and only if) they belong to ``mappings``."""
    _advise(tensor, mappings, _MADV_DONTNEED, _MARGIN)
