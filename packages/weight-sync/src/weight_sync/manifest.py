"""The per-version manifest and the ``latest`` pointer, with strict parsing."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from weight_sync._hashing import HEX_DIGITS, SHA256, valid_digest
from weight_sync.errors import VerificationError

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "weight-sync/manifest/v1"
POINTER_FORMAT = "weight-sync/latest/v1"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class FileEntry:
    """Size in bytes and hex digest (in the manifest's ``hash_algorithm``) of one file."""

    size: int
    digest: str


@dataclass(frozen=True)
class Manifest:
    """What a version contains: every file's size and checksum, plus provenance.

    ``hash_algorithm`` names the checksum. A ``sha256`` manifest is written exactly as before
    the field existed (no ``hash_algorithm`` key, a ``sha256`` key per file), so older readers
    still read it; any other algorithm is written as a top-level ``hash_algorithm`` and a
    per-file key of that name, which older readers refuse (no ``sha256``) instead of misreading.
    """

    version: int
    step: int
    created_at: str
    producer: str
    files: Mapping[str, FileEntry]
    hash_algorithm: str = SHA256

    @property
    def total_size(self) -> int:
        return sum(e.size for e in self.files.values())

    def to_json(self) -> bytes:
        alg = self.hash_algorithm
        doc: dict[str, object] = {
            "format": MANIFEST_FORMAT,
            "version": self.version,
            "step": self.step,
            "created_at": self.created_at,
            "producer": self.producer,
            "total_size": self.total_size,
        }
        if alg != SHA256:
            doc["hash_algorithm"] = alg
        doc["files"] = {
            name: {"size": e.size, alg: e.digest} for name, e in sorted(self.files.items())
        }
        return (json.dumps(doc, indent=2) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Manifest:
        """Parse a manifest; any malformation is a ``VerificationError`` naming ``where``."""
        doc = _load_object(data, where)
        if doc.get("format") != MANIFEST_FORMAT:
            raise VerificationError(f"{where}: unknown manifest format {doc.get('format')!r}")
        alg = doc.get("hash_algorithm", SHA256)
        if not isinstance(alg, str) or alg not in HEX_DIGITS:
            raise VerificationError(f"{where}: unknown hash_algorithm {alg!r}")
        files_raw = doc.get("files")
        if not isinstance(files_raw, dict) or not files_raw:
            raise VerificationError(f"{where}: 'files' must be a non-empty object")
        files: dict[str, FileEntry] = {}
        for name, entry in cast(dict[str, Any], files_raw).items():
            if not valid_file_path(name):
                raise VerificationError(f"{where}: invalid file name {name!r}")
            if not isinstance(entry, dict):
                raise VerificationError(f"{where}: files[{name!r}] must be an object")
            e = cast(dict[str, Any], entry)
            size, digest = e.get("size"), e.get(alg)
            if not _is_nonneg_int(size):
                raise VerificationError(f"{where}: files[{name!r}].size must be an integer >= 0")
            if not valid_digest(alg, digest):
                raise VerificationError(f"{where}: files[{name!r}].{alg} is not a {alg} hex")
            files[name] = FileEntry(size=cast(int, size), digest=cast(str, digest))
        total = doc.get("total_size")
        if total != sum(e.size for e in files.values()):
            raise VerificationError(f"{where}: total_size {total!r} != sum of file sizes")
        return cls(
            version=_get_int(doc, "version", where),
            step=_get_int(doc, "step", where),
            created_at=_get_str(doc, "created_at", where),
            producer=_get_str(doc, "producer", where),
            files=files,
            hash_algorithm=alg,
        )


@dataclass(frozen=True)
class Pointer:
    """Content of ``R/latest``: the newest published version and its manifest's sha256."""

    version: int
    manifest_sha256: str
    updated_at: float

    def to_json(self) -> bytes:
        doc = {
            "format": POINTER_FORMAT,
            "version": self.version,
            "dir": f"versions/{version_dir_name(self.version)}",
            "manifest_sha256": self.manifest_sha256,
            "updated_at": self.updated_at,
        }
        return (json.dumps(doc) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Pointer:
        doc = _load_object(data, where)
        if doc.get("format") != POINTER_FORMAT:
            raise VerificationError(f"{where}: unknown pointer format {doc.get('format')!r}")
        sha = doc.get("manifest_sha256")
        if not isinstance(sha, str) or not _SHA256.match(sha):
            raise VerificationError(f"{where}: manifest_sha256 is not a sha256 hex")
        updated = doc.get("updated_at")
        if not isinstance(updated, int | float) or isinstance(updated, bool):
            raise VerificationError(f"{where}: updated_at must be a number")
        return cls(_get_int(doc, "version", where), sha, float(updated))


def version_dir_name(version: int) -> str:
    """``v`` plus the version zero-padded to 9 digits, so names sort in version order."""
    return f"v{version:09d}"


_VERSION_DIR = re.compile(r"^v(\d{9,})$")


def parse_version_dir(name: str) -> int | None:
    """The version a :func:`version_dir_name` name stands for; None for any other name."""
    m = _VERSION_DIR.match(name)
    return int(m.group(1)) if m else None


def valid_file_name(name: str) -> bool:
    """Flat, visible file names only: no separators, no dot-files, not the manifest itself."""
    return (
        bool(name)
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
        and not name.startswith(".")
        and name != MANIFEST_NAME
    )


def valid_file_path(name: str) -> bool:
    """A flat name, or a relative POSIX path of visible parts (the entries of a nested tree)."""
    parts = name.split("/")
    if len(parts) == 1:
        return valid_file_name(name)
    return all(p and not p.startswith(".") and "\\" not in p and "\0" not in p for p in parts)


def _load_object(data: bytes, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise VerificationError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise VerificationError(f"{where}: expected a JSON object")
    return cast(dict[str, Any], doc)


def _is_nonneg_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _get_int(doc: dict[str, Any], key: str, where: str) -> int:
    v = doc.get(key)
    if not _is_nonneg_int(v):
        raise VerificationError(f"{where}: {key!r} must be an integer >= 0")
    return cast(int, v)


def _get_str(doc: dict[str, Any], key: str, where: str) -> str:
    v = doc.get(key)
    if not isinstance(v, str):
        raise VerificationError(f"{where}: {key!r} must be a string")
    return v
