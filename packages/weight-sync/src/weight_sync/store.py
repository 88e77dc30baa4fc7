"""``AdapterStore``: atomic, verified, versioned LoRA adapters on a shared POSIX filesystem.

Layout under the root ``R`` (everything on one filesystem so renames are atomic)::

    R/versions/v000000123/{adapter_config.json, adapter_model.safetensors, manifest.json}
    R/latest                      JSON pointer, replaced by tmp+fsync+rename, written last
    R/leases/v000000123.<reader>.json   reader pins with an expiry
    R/.staging/<uuid>/            a version being written; renamed into versions/ when complete
    R/.trash/                     versions being deleted (renamed out of versions/ first)
    R/.publish.lock               flock held by the one active publisher (and by gc)

A version is *published* when its directory is in ``versions/`` and its number is at most the
one in ``latest``. A directory above ``latest`` is the leftover of a publisher killed between
its two renames; the next publisher or ``gc`` removes it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, cast

from weight_sync import _hashing, _peft
from weight_sync._fsutil import (
    WriteHook,
    copy_hashed,
    is_no_space,
    storage_full,
    write_hashed,
)
from weight_sync._lock import PublisherLock
from weight_sync.errors import (
    InvalidAdapterError,
    LeaseError,
    VerificationError,
    VersionConflictError,
    VersionNotFoundError,
    WeightSyncError,
)
from weight_sync.fs import VerifyCache, atomic_write_bytes, fsync_dir, verify_manifest
from weight_sync.manifest import (
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    Pointer,
    parse_version_dir,
    valid_file_name,
    version_dir_name,
)

VERSIONS = "versions"
STAGING = ".staging"
TRASH = ".trash"
LEASES = "leases"
LATEST = "latest"
_READER_ID = re.compile(r"^[A-Za-z0-9_\-]{1,100}$")


@dataclass(frozen=True)
class PublishedVersion:
    """A complete version on disk. ``path`` is the PEFT adapter directory to load."""

    version: int
    step: int
    path: Path
    manifest: Manifest
    published_at: float | None = None
    """Wall-clock time the ``latest`` pointer named this version (None if not the latest)."""

    def file(self, name: str) -> Path:
        if name not in self.manifest.files:
            raise KeyError(f"{name!r} is not in version {self.version}")
        return self.path / name


@dataclass(frozen=True)
class LeaseInfo:
    """A lease file as read back: which reader pins which version, until when."""

    version: int
    reader: str
    expires_at: float
    path: Path

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at <= (time.time() if now is None else now)


@dataclass
class GcReport:
    """What one ``gc`` did: versions removed, kept, pinned by a live lease; leftovers cleaned."""

    removed: list[int] = field(default_factory=lambda: [])
    kept: list[int] = field(default_factory=lambda: [])
    pinned: list[int] = field(default_factory=lambda: [])
    leftovers_removed: list[str] = field(default_factory=lambda: [])
    expired_leases_removed: int = 0


class Lease:
    """A reader's pin on one version; ``gc`` never deletes a version with a live lease."""

    def __init__(self, store: AdapterStore, version: int, reader: str, ttl: float) -> None:
        self.store = store
        self.version = version
        self.reader = reader
        self.path = store.root / LEASES / f"{version_dir_name(version)}.{reader}.json"
        self.expires_at = 0.0
        self._write(ttl)

    def _write(self, ttl: float) -> None:
        if ttl <= 0:
            raise LeaseError(f"lease ttl must be > 0, got {ttl}")
        expires = time.time() + ttl
        doc = {
            "version": self.version,
            "reader": self.reader,
            "expires_at": expires,
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        try:
            atomic_write_bytes(self.path, json.dumps(doc).encode(), durable=False)
        except OSError as exc:
            raise LeaseError(f"{self.path}: cannot write lease ({exc.strerror})") from exc
        self.expires_at = expires

    def renew(self, ttl: float) -> None:
        if not self.path.exists():
            raise LeaseError(f"{self.path}: lease is gone (released or expired and collected)")
        self._write(ttl)

    def release(self) -> None:
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class AdapterStore:
    """Publish, read, verify, pin and garbage-collect adapter versions under ``root``.

    ``durable=False`` skips fsync (only for throwaway local roots; SIGKILL is still safe, power
    loss is not). ``write_hook`` is called before each chunk written during publish and may
    raise ``OSError`` to inject faults. ``hash_algorithm`` is the checksum new versions'
    manifests record: ``auto`` (``xxh3-128`` when the ``xxhash`` package is installed, else
    ``sha256``), ``xxh3-128`` or ``sha256`` (for readers older than the ``hash_algorithm``
    field). Reading follows whatever each manifest names.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        durable: bool = True,
        write_hook: WriteHook | None = None,
        hash_algorithm: str = _hashing.AUTO,
    ) -> None:
        self.root = Path(root).absolute()
        self.durable = durable
        self.write_hook = write_hook
        self.hash_algorithm = _hashing.resolve(hash_algorithm)
        self._cache: VerifyCache = {}
        try:
            for sub in (VERSIONS, STAGING, TRASH, LEASES):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WeightSyncError(f"{self.root}: cannot create store ({exc.strerror})") from exc

    # ------------------------------------------------------------------ reading

    def version_path(self, version: int) -> Path:
        return self.root / VERSIONS / version_dir_name(version)

    def pointer(self) -> Pointer | None:
        """The ``latest`` pointer (one small read; what pollers check)."""
        path = self.root / LATEST
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        return Pointer.from_json(data, str(path))

    def latest_version(self) -> int | None:
        ptr = self.pointer()
        return None if ptr is None else ptr.version

    def versions(self) -> list[int]:
        """Published version numbers, oldest first."""
        ptr = self.pointer()
        if ptr is None:
            return []
        return [v for v in self._dir_versions() if v <= ptr.version]

    def latest(self, *, verify: bool = True) -> PublishedVersion | None:
        """The newest published version, verified against its manifest unless ``verify=False``."""
        ptr = self.pointer()
        if ptr is None:
            return None
        return self._open(ptr.version, ptr, verify=verify, use_cache=True)

    def get(self, version: int, *, verify: bool = True) -> PublishedVersion:
        return self._open(version, self.pointer(), verify=verify, use_cache=True)

    def verify(self, version: int | None = None, *, use_cache: bool = True) -> PublishedVersion:
        """Check every file's size and checksum (and that no file is missing or extra).

        ``use_cache=False`` re-hashes everything; with the cache, files whose
        (inode, size, mtime, ctime) are unchanged since they last verified are not re-read.
        """
        ptr = self.pointer()
        if version is None:
            if ptr is None:
                raise VersionNotFoundError(f"{self.root}: nothing published yet")
            version = ptr.version
        return self._open(version, ptr, verify=True, use_cache=use_cache)

    def _open(
        self, version: int, ptr: Pointer | None, *, verify: bool, use_cache: bool
    ) -> PublishedVersion:
        path = self.version_path(version)
        if ptr is None or version > ptr.version:
            raise VersionNotFoundError(f"{path}: version {version} is not published")
        mpath = path / MANIFEST_NAME
        try:
            raw = mpath.read_bytes()
        except FileNotFoundError:
            if path.is_dir():  # gc renames whole directories, so this is damage, not a race
                raise VerificationError(f"{mpath}: manifest is missing") from None
            raise VersionNotFoundError(
                f"{path}: version {version} does not exist (never published or collected)"
            ) from None
        is_latest = version == ptr.version
        if is_latest and hashlib.sha256(raw).hexdigest() != ptr.manifest_sha256:
            raise VerificationError(
                f"{mpath}: sha256 does not match the one recorded in {self.root / LATEST}"
            )
        manifest = Manifest.from_json(raw, str(mpath))
        if manifest.version != version:
            raise VerificationError(
                f"{mpath}: manifest says version {manifest.version}, directory is {version}"
            )
        if verify:
            self._verify_files(path, manifest, use_cache)
        return PublishedVersion(
            version=version,
            step=manifest.step,
            path=path,
            manifest=manifest,
            published_at=ptr.updated_at if is_latest else None,
        )

    def _verify_files(self, path: Path, manifest: Manifest, use_cache: bool) -> None:
        verify_manifest(path, manifest, cache=self._cache if use_cache else None)

    def _dir_versions(self) -> list[int]:
        out: list[int] = []
        for name in os.listdir(self.root / VERSIONS):
            v = parse_version_dir(name)
            if v is not None:
                out.append(v)
        return sorted(out)

    # ------------------------------------------------------------------ publishing

    def publish(
        self,
        source: str | os.PathLike[str] | Mapping[str, bytes],
        *,
        version: int | None = None,
        step: int | None = None,
        producer: str | None = None,
        keep: int | None = None,
        lock_timeout: float = 0.0,
    ) -> PublishedVersion:
        """Publish a PEFT adapter directory (or ``{file name: bytes}``) as a new version.

        ``version`` defaults to latest + 1 and must be greater than the latest. ``keep``
        runs ``gc(keep)`` afterwards. Raises ``PublisherBusyError`` if another publisher
        holds the lock for longer than ``lock_timeout`` seconds.
        """
        for what, value in (("version", version), ("step", step)):
            # Typed as int, but callers may pass bools or floats; a bad manifest is forever.
            if value is not None and (type(value) is not int or value < 0):
                raise VersionConflictError(f"{what} must be an integer >= 0, got {value!r}")
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        items = _collect_source(source)
        producer = producer or f"{socket.gethostname()}:{os.getpid()}"
        with PublisherLock(self.root, timeout=lock_timeout, purpose="publish"):
            ptr = self.pointer()
            current = None if ptr is None else ptr.version
            if version is None:
                version = 1 if current is None else current + 1
            if current is not None and version <= current:
                raise VersionConflictError(
                    f"{self.root}: cannot publish version {version}; latest is {current} "
                    "and versions must increase"
                )
            self._collect_leftovers(current)
            manifest, mraw = self._write_version(items, version, step, producer)
            now = time.time()
            pointer = Pointer(version, hashlib.sha256(mraw).hexdigest(), now)
            try:
                atomic_write_bytes(self.root / LATEST, pointer.to_json(), durable=self.durable)
            except OSError as exc:
                # The version never became visible: take it back out so nothing dangles.
                self._discard(self.version_path(version))
                if is_no_space(exc):
                    raise storage_full(exc, str(self.root / LATEST)) from exc
                raise
            if keep is not None:
                self._gc_locked(keep)
        return PublishedVersion(
            version=version,
            step=manifest.step,
            path=self.version_path(version),
            manifest=manifest,
            published_at=now,
        )

    def _write_version(
        self,
        items: list[tuple[str, Path | bytes]],
        version: int,
        step: int | None,
        producer: str,
    ) -> tuple[Manifest, bytes]:
        staging = self.root / STAGING / uuid.uuid4().hex
        try:
            staging.mkdir()
            files: dict[str, FileEntry] = {}
            for name, src in items:
                dst = staging / name
                where = str(src) if isinstance(src, Path) else f"{name} (in memory)"
                expected = _expected_size(name, src)
                alg = self.hash_algorithm
                if isinstance(src, Path):
                    size, digest = copy_hashed(
                        src, dst, name, hook=self.write_hook, durable=self.durable, algorithm=alg
                    )
                else:
                    size, digest = write_hashed(
                        src, dst, name, hook=self.write_hook, durable=self.durable, algorithm=alg
                    )
                if expected is not None and size != expected:
                    raise InvalidAdapterError(
                        f"{where}: safetensors header implies {expected} bytes but {size} were "
                        "read (truncated, or still being written)"
                    )
                if size == 0:
                    raise InvalidAdapterError(f"{where}: file is empty")
                files[name] = FileEntry(size, digest)
            manifest = Manifest(
                version=version,
                step=version if step is None else step,
                created_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
                producer=producer,
                files=files,
                hash_algorithm=self.hash_algorithm,
            )
            mraw = manifest.to_json()
            # Manifest last: a staging dir with a manifest has all its files complete.
            write_hashed(mraw, staging / MANIFEST_NAME, MANIFEST_NAME, hook=None, durable=True)
            if self.durable:
                fsync_dir(staging)
            target = self.version_path(version)
            try:
                os.rename(staging, target)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    raise VersionConflictError(
                        f"{target}: version {version} already exists"
                    ) from None
                raise
        except BaseException as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, OSError) and is_no_space(exc):
                raise storage_full(exc, f"version {version} into {staging}") from exc
            raise
        if self.durable:
            fsync_dir(target.parent)
        return manifest, mraw

    # ------------------------------------------------------------------ leases and gc

    def pin(self, version: int, reader: str, ttl: float = 300.0) -> Lease:
        """Pin ``version`` for ``ttl`` seconds so ``gc`` keeps it; use as a context manager."""
        if not _READER_ID.match(reader):
            raise LeaseError(f"reader id {reader!r} must match {_READER_ID.pattern}")
        lease = Lease(self, version, reader, ttl)
        # Check *after* the lease is visible. gc marks a version before its last look at the
        # leases, so either we see the mark (and back off) or gc sees our lease (and keeps it).
        ptr = self.pointer()
        if (
            ptr is None
            or version > ptr.version
            or self._collect_mark(version).exists()
            or not (self.version_path(version) / MANIFEST_NAME).exists()
        ):
            lease.release()
            raise VersionNotFoundError(
                f"{self.version_path(version)}: cannot pin version {version}: not published"
            )
        return lease

    def leases(self) -> list[LeaseInfo]:
        out: list[LeaseInfo] = []
        for entry in os.scandir(self.root / LEASES):
            if entry.name.startswith(".") or not entry.name.endswith(".json"):
                continue
            path = Path(entry.path)
            try:
                doc = cast(dict[str, Any], json.loads(path.read_bytes()))
                info = LeaseInfo(
                    int(doc["version"]), str(doc["reader"]), float(doc["expires_at"]), path
                )
            except FileNotFoundError:
                continue
            except (ValueError, KeyError, TypeError):
                # An unreadable lease protects nothing; its version is recoverable from the
                # name, so treat it as a live pin of that version until an hour after mtime.
                v = parse_version_dir(entry.name.split(".", 1)[0])
                if v is None:
                    continue
                try:
                    mtime = path.stat().st_mtime
                except FileNotFoundError:
                    continue
                info = LeaseInfo(v, "?", mtime + 3600.0, path)
            out.append(info)
        return out

    def gc(self, keep: int, *, lock_timeout: float = 30.0) -> GcReport:
        """Keep the newest ``keep`` versions plus pinned ones; remove crashed leftovers."""
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        with PublisherLock(self.root, timeout=lock_timeout, purpose="gc"):
            return self._gc_locked(keep)

    def _gc_locked(self, keep: int) -> GcReport:
        report = GcReport()
        ptr = self.pointer()
        current = None if ptr is None else ptr.version
        report.leftovers_removed = self._collect_leftovers(current)
        now = time.time()
        live: set[int] = set()
        for lease in self.leases():
            if lease.expired(now):
                lease.path.unlink(missing_ok=True)
                report.expired_leases_removed += 1
            else:
                live.add(lease.version)
        published = self.versions()
        report.kept = published[-keep:]
        for v in published[:-keep]:
            if v in live:
                report.pinned.append(v)
                continue
            mark = self._collect_mark(v)
            mark.touch()
            try:
                if any(le.version == v and not le.expired() for le in self.leases()):
                    report.pinned.append(v)  # a reader pinned it before seeing the mark
                    continue
                self._discard(self.version_path(v))
                report.removed.append(v)
            finally:
                mark.unlink(missing_ok=True)
        if self.durable:
            fsync_dir(self.root / VERSIONS)
        return report

    def _collect_mark(self, version: int) -> Path:
        return self.root / LEASES / f".collecting.{version_dir_name(version)}"

    def _collect_leftovers(self, current: int | None) -> list[str]:
        """Remove what killed publishers and collectors left behind, and list what went.

        Under the lock no one else writes, so staging dirs, trash and unpointed versions
        are leftovers of killed publishers/collectors.
        """
        removed: list[str] = []
        for sub in (STAGING, TRASH):
            for entry in os.scandir(self.root / sub):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(f"{sub}/{entry.name}")
        for v in self._dir_versions():
            if current is None or v > current:
                self._discard(self.version_path(v))
                removed.append(f"{VERSIONS}/{version_dir_name(v)}")
        for entry in os.scandir(self.root):
            if entry.name.startswith(f".{LATEST}.tmp."):
                Path(entry.path).unlink(missing_ok=True)
                removed.append(entry.name)
        # Readers write lease temp files without the lock: only collect clearly abandoned ones.
        cutoff = time.time() - 3600.0
        for entry in os.scandir(self.root / LEASES):
            if entry.name.startswith(".collecting."):
                Path(entry.path).unlink(missing_ok=True)  # a gc died mid-way
            elif entry.name.startswith(".") and ".tmp." in entry.name:
                try:
                    if entry.stat().st_mtime < cutoff:
                        Path(entry.path).unlink(missing_ok=True)
                except FileNotFoundError:
                    pass
        return removed

    def _discard(self, path: Path) -> None:
        dst = self.root / TRASH / f"{path.name}.{uuid.uuid4().hex}"
        try:
            os.rename(path, dst)
        except FileNotFoundError:
            return
        shutil.rmtree(dst, ignore_errors=True)


def _collect_source(
    source: str | os.PathLike[str] | Mapping[str, bytes],
) -> list[tuple[str, Path | bytes]]:
    items: list[tuple[str, Path | bytes]] = []
    if isinstance(source, Mapping):
        for name, data in cast(Mapping[Any, Any], source).items():
            if not isinstance(name, str) or not valid_file_name(name):
                raise InvalidAdapterError(f"invalid adapter file name {name!r}")
            if not isinstance(data, bytes | bytearray | memoryview):
                raise InvalidAdapterError(f"{name}: content must be bytes")
            items.append((name, bytes(cast(bytes, data))))
        where = "in-memory adapter"
    else:
        src = Path(source)
        if not src.is_dir():
            raise InvalidAdapterError(f"{src}: adapter source is not a directory")
        for entry in sorted(os.scandir(src), key=lambda e: e.name):
            if entry.name.startswith("."):
                continue
            if entry.is_dir():
                raise InvalidAdapterError(
                    f"{entry.path}: nested directories are not supported in an adapter"
                )
            if not entry.is_file():
                raise InvalidAdapterError(f"{entry.path}: not a regular file")
            if not valid_file_name(entry.name):
                raise InvalidAdapterError(f"{entry.path}: reserved file name")
            items.append((entry.name, Path(entry.path)))
        where = str(src)
    names = {n for n, _ in items}
    if _peft.CONFIG_NAME not in names:
        raise InvalidAdapterError(f"{where}: missing {_peft.CONFIG_NAME}")
    if not names.intersection(_peft.WEIGHT_NAMES):
        raise InvalidAdapterError(f"{where}: missing {' or '.join(_peft.WEIGHT_NAMES)}")
    for name, data in items:
        if name == _peft.CONFIG_NAME:
            _peft.check_config(_head(data, None), _where(name, data))
    return items


def _where(name: str, data: Path | bytes) -> str:
    return str(data) if isinstance(data, Path) else f"{name} (in memory)"


def _head(data: Path | bytes, n: int | None) -> bytes:
    """The first ``n`` bytes (all of them if ``n`` is None) of a source file."""
    if isinstance(data, Path):
        try:
            with open(data, "rb") as f:
                return f.read() if n is None else f.read(n)
        except OSError as exc:
            raise InvalidAdapterError(f"{data}: cannot read ({exc.strerror})") from exc
    return bytes(data) if n is None else bytes(data[:n])


def _expected_size(name: str, data: Path | bytes) -> int | None:
    """For safetensors files, the size the header promises (catches truncated sources)."""
    if not name.endswith(".safetensors"):
        return None
    where = _where(name, data)
    head = _head(data, 8)
    n, _ = _peft.safetensors_size(head, where)
    _, expected = _peft.safetensors_size(_head(data, 8 + n), where)
    if expected < 0:
        raise InvalidAdapterError(f"{where}: safetensors header is truncated")
    return expected
