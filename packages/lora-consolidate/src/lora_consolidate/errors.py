"""Typed errors. Every message names the file (and key) at fault so an operator can act on it."""

from __future__ import annotations

from pathlib import Path


class ConsolidationError(Exception):
    """Base class for every error this package raises on bad input or bad configuration."""


class ShardError(ConsolidationError):
    """A shard file (or a DCP storage file) is missing, unreadable or inconsistent with the rest."""

    def __init__(self, path: Path | str, message: str, *, key: str | None = None) -> None:
        self.path = Path(path)
        self.key = key
        self.message = message
        where = f"{self.path}" if key is None else f"{self.path} [key {key!r}]"
        super().__init__(f"{where}: {message}")

    def __reduce__(self) -> tuple[object, ...]:
        # Picklable as raised, so it crosses process boundaries (a Ray task on the head node).
        return (_shard_error, (self.path, self.message, self.key))


def _shard_error(path: Path, message: str, key: str | None) -> ShardError:
    return ShardError(path, message, key=key)


class OutputExistsError(ConsolidationError):
    """The output path already exists and overwriting was not requested."""
