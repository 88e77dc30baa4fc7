"""The checksums a manifest may name, and hashing a file's bytes without copying them.

``sha256`` (stdlib) is what every manifest without a ``hash_algorithm`` field uses.
``xxh3-128`` (the optional ``xxhash`` package, ``weight-sync[fast]``) is about ten times
faster: it hashes from the page cache faster than the kernel copies the same bytes, so the
checksum no longer costs more than the copy it protects. It detects torn, truncated and
corrupted files, which is what the manifest is for; it is not a defence against someone who
can write the store on purpose (such a writer could rewrite manifest and pointer as well).
"""

from __future__ import annotations

import hashlib
import importlib.util
import mmap
import os
import re
from typing import Protocol

from weight_sync.errors import WeightSyncError

SHA256 = "sha256"
XXH3_128 = "xxh3-128"
HEX_DIGITS = {SHA256: 64, XXH3_128: 32}
"""Known algorithms and the length of their hex digests."""
AUTO = "auto"
"""Publish with ``xxh3-128`` when ``xxhash`` is installed, else with ``sha256``."""

_HEX = {alg: re.compile(f"^[0-9a-f]{{{n}}}$") for alg, n in HEX_DIGITS.items()}
_MAP_CHUNK = 64 << 20


class Hasher(Protocol):
    """The part of ``hashlib``'s interface the copy and verify loops use."""

    def update(self, data: bytes | bytearray | memoryview, /) -> object:
        """Feed more bytes."""
        ...

    def hexdigest(self) -> str:
        """The digest of everything fed so far, as lowercase hex."""
        ...


def fast_available() -> bool:
    """Whether ``xxh3-128`` can be computed here (the ``xxhash`` package is installed)."""
    return importlib.util.find_spec("xxhash") is not None


def resolve(algorithm: str) -> str:
    """The concrete algorithm ``algorithm`` names (``auto`` picks the fastest one installed).

    Raises:
        WeightSyncError: Unknown algorithm, or ``xxh3-128`` without the ``xxhash`` package.
    """
    if algorithm == AUTO:
        return XXH3_128 if fast_available() else SHA256
    if algorithm not in HEX_DIGITS:
        raise WeightSyncError(
            f"unknown hash algorithm {algorithm!r}; known: {AUTO}, {', '.join(HEX_DIGITS)}"
        )
    new_hasher(algorithm)  # fail now, not half-way through a publish
    return algorithm


def valid_digest(algorithm: str, digest: object) -> bool:
    """Whether ``digest`` is a lowercase hex digest of ``algorithm``'s length."""
    pattern = _HEX.get(algorithm)
    return pattern is not None and isinstance(digest, str) and bool(pattern.match(digest))


def new_hasher(algorithm: str) -> Hasher:
    """A fresh hash object for ``algorithm``.

    Raises:
        WeightSyncError: The algorithm is unknown or its package is not installed.
    """
    if algorithm == SHA256:
        return hashlib.sha256()
    if algorithm == XXH3_128:
        try:
            import xxhash
        except ImportError:
            raise WeightSyncError(
                "xxh3-128 manifests need the xxhash package: pip install 'weight-sync[fast]'"
            ) from None
        return xxhash.xxh3_128()
    raise WeightSyncError(f"unknown hash algorithm {algorithm!r}")


def hash_mapped(fd: int, offset: int, count: int, hasher: Hasher) -> None:
    """Feed bytes ``[offset, offset + count)`` of ``fd`` to ``hasher`` through ``mmap``.

    Reading the page cache in place skips the copy into a user buffer that ``read`` makes,
    which on these machines costs more than ``xxh3-128`` itself. ``offset`` must be a multiple
    of ``mmap.ALLOCATIONGRANULARITY`` and the range must lie within the file: only use it on
    files nobody truncates meanwhile (a staging file this process writes, a published
    version), since touching a page past a concurrent truncation raises ``SIGBUS``.
    """
    end = offset + count
    while offset < end:
        n = min(_MAP_CHUNK, end - offset)
        with mmap.mmap(fd, n, offset=offset, access=mmap.ACCESS_READ) as m:
            view = memoryview(m)
            try:
                hasher.update(view)
            finally:
                view.release()
        offset += n


def hash_path_mapped(path: str | os.PathLike[str], algorithm: str) -> tuple[int, str]:
    """Size and digest of a file that nobody truncates while it is hashed (see ``hash_mapped``).

    Raises:
        OSError: The file cannot be opened.
        WeightSyncError: The algorithm is unknown or not installed.
    """
    hasher = new_hasher(algorithm)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size:
            hash_mapped(fd, 0, size, hasher)
    finally:
        os.close(fd)
    return size, hasher.hexdigest()
