"""Checksums an output is hashed with as it is written: the names weight-sync's manifests use.

``sha256`` is readable by every manifest reader. ``xxh3-128`` (the optional ``xxhash`` package,
as in ``weight-sync[fast]``) is about ten times faster here (13 GB/s against 1.5 GB/s on one
core), so hashing stops bounding the copy. ``auto`` picks ``xxh3-128`` when it is installed, as
``weight_sync.AdapterStore`` does, so a digest can be compared with the manifest it publishes.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from typing import Any, Protocol

from lora_consolidate.errors import ConsolidationError

SHA256 = "sha256"
XXH3_128 = "xxh3-128"
AUTO = "auto"


class Hasher(Protocol):
    """The part of ``hashlib``'s interface the writer uses."""

    def update(self, data: bytes | bytearray | memoryview, /) -> object:
        """Feed more bytes."""
        ...

    def hexdigest(self) -> str:
        """The digest so far, as lowercase hex."""
        ...


def resolve(algorithm: str) -> str:
    """The concrete algorithm ``algorithm`` names (``auto``: the fastest one installed).

    Raises:
        ConsolidationError: Unknown algorithm, or ``xxh3-128`` without ``xxhash``.
    """
    if algorithm == AUTO:
        return XXH3_128 if importlib.util.find_spec("xxhash") is not None else SHA256
    new_hasher(algorithm)  # fail now, not after the work
    return algorithm


def new_hasher(algorithm: str) -> Hasher:
    """A fresh hash object for a concrete algorithm.

    Raises:
        ConsolidationError: Unknown algorithm, or ``xxh3-128`` without ``xxhash``.
    """
    if algorithm == SHA256:
        return hashlib.sha256()
    if algorithm == XXH3_128:
        try:
            xxhash: Any = importlib.import_module("xxhash")
        except ImportError:
            raise ConsolidationError(
                "xxh3-128 needs the xxhash package: pip install 'weight-sync[fast]'"
            ) from None
        return xxhash.xxh3_128()
    raise ConsolidationError(
        f"unknown hash algorithm {algorithm!r}; known: {AUTO}, {SHA256}, {XXH3_128}"
    )
