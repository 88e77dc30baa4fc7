"""Crash-safe filesystem primitives: atomic files, staged directories, fsync, manifests.

Everything here keeps one promise: a reader (or a process started after a crash, even a
SIGKILL or power loss once ``durable`` writes returned) sees the old content or the new
content, never a mix. The tools are the ones ``AdapterStore`` is built from, so other packages
get the same guarantees without their own copies:

- ``atomic_write_bytes`` / ``atomic_write_text`` / ``atomic_write_json``: a temp file in the same
  directory, fsynced, renamed over the target, then the directory fsynced.
- ``staged_dir``: build a directory beside the target and swap it in by rename on success.
- ``write_manifest`` / ``verify_manifest``: size + checksum (sha256 by default, or xxh3-128)
  of every file of a flat directory, in the same ``manifest.json`` format as published adapter
  versions.

Only the standard library is needed (xxh3-128 uses the optional ``xxhash`` package).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import os
import shutil
import socket
import threading
import uuid
from collections.abc import Callable, Generator
from datetime import UTC, datetime
from pathlib import Path

from weight_sync._fsutil import CHUNK, write_all
from weight_sync._hashing import SHA256, hash_path_mapped, new_hasher, resolve
from weight_sync.errors import VerificationError, VersionNotFoundError, WeightSyncError
from weight_sync.manifest import MANIFEST_NAME, FileEntry, Manifest, valid_file_name

__all__ = [
    "MANIFEST_NAME",
    "StrPath",
    "VerifyCache",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "fsync_dir",
    "fsync_file",
    "fsync_tree",
    "hash_file",
    "read_json",
    "read_manifest",
    "staged_dir",
    "verify_manifest",
    "write_manifest",
]

StrPath = str | os.PathLike[str]
"""A filesystem path as a string or path-like object."""

VerifyCache = dict[tuple[str, int, int, int, int], str]
"""Maps ``(path, inode, size, mtime_ns, ctime_ns)`` to ``algorithm:digest`` computed for it."""


# ---------------------------------------------------------------------------------- fsync


def fsync_file(path: StrPath) -> None:
    """Flush a file's data and metadata to stable storage.

    Args:
        path: The file to flush.

    Raises:
        OSError: The file cannot be opened or the flush fails.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: StrPath) -> None:
    """Flush a directory, making the creations, renames and removals in it durable.

    Args:
        path: The directory to flush.

    Raises:
        OSError: The directory cannot be opened or the flush fails.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: StrPath) -> None:
    """Flush every regular file and every directory under ``root`` (``root`` included).

    Args:
        root: The top of the tree.

    Raises:
        OSError: A file or directory cannot be flushed.
    """
    # Bottom-up, so a directory is flushed only after everything it names.
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                fsync_file(path)
        fsync_dir(dirpath)


# ---------------------------------------------------------------------------------- files


def atomic_write_bytes(
    path: StrPath, data: bytes | bytearray | memoryview, *, durable: bool = True
) -> None:
    """Replace ``path`` with ``data``; readers see the old or the new content, never a mix.

    The data goes to a temp file ``.<name>.tmp.<hex>`` in the same directory (so the rename
    stays on one filesystem), is fsynced, renamed over ``path``, and the directory is fsynced.
    A writer killed part-way leaves ``path`` untouched and at most that temp file behind.

    Args:
        path: The file to create or replace; its directory must exist.
        data: The complete new content.
        durable: Fsync the file and the directory. ``False`` is still safe against a killed
            process, but not against power loss.

    Raises:
        OSError: The write or the rename fails; the temp file is removed and ``path`` is
            unchanged.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.{uuid.uuid4().hex}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, memoryview(data).cast("B"))
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_write_text(
    path: StrPath, text: str, *, encoding: str = "utf-8", durable: bool = True
) -> None:
    """Replace ``path`` with ``text``, atomically (see ``atomic_write_bytes``).

    Args:
        path: The file to create or replace; its directory must exist.
        text: The complete new content, written without newline translation.
        encoding: The text encoding.
        durable: Fsync the file and the directory.

    Raises:
        OSError: The write or the rename fails; ``path`` is unchanged.
        UnicodeEncodeError: ``text`` cannot be encoded; nothing is written.
    """
    atomic_write_bytes(path, text.encode(encoding), durable=durable)


def atomic_write_json(
    path: StrPath,
    obj: object,
    *,
    indent: int | None = 2,
    sort_keys: bool = False,
    durable: bool = True,
) -> None:
    """Replace ``path`` with ``obj`` as JSON plus a final newline, atomically.

    Args:
        path: The file to create or replace; its directory must exist.
        obj: Anything ``json.dumps`` accepts.
        indent: Passed to ``json.dumps``; ``None`` writes one line.
        sort_keys: Passed to ``json.dumps``.
        durable: Fsync the file and the directory.

    Raises:
        TypeError: ``obj`` is not JSON-serialisable; nothing is written.
        ValueError: ``obj`` contains a circular reference; nothing is written.
        OSError: The write or the rename fails; ``path`` is unchanged.
    """
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n"
    atomic_write_bytes(path, text.encode(), durable=durable)


def read_json(path: StrPath) -> object | None:
    """Parse a JSON file, or return ``None`` when it is missing or unreadable.

    Meant for state files written with ``atomic_write_json``: a file that does not parse is
    treated like one that is not there.

    Args:
        path: The file to read.

    Returns:
        The parsed document, or ``None`` when the file is missing, cannot be read, is not
        UTF-8 or is not valid JSON.
    """
    try:
        return json.loads(Path(path).read_bytes())
    except (OSError, ValueError):
        return None


def hash_file(path: StrPath, algorithm: str = SHA256) -> tuple[int, str]:
    """Size and checksum of a file, read with large buffers.

    Args:
        path: The file to hash.
        algorithm: ``sha256`` or ``xxh3-128`` (needs the ``xxhash`` package).

    Returns:
        ``(size in bytes, hex digest)``.

    Raises:
        OSError: The file cannot be read.
        WeightSyncError: The algorithm is unknown or not installed.
    """
    h = new_hasher(algorithm)
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    size = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
            size += n
    return size, h.hexdigest()


# ---------------------------------------------------------------------------------- dirs


@contextlib.contextmanager
def staged_dir(target: StrPath, *, durable: bool = True) -> Generator[Path]:
    """Build a directory off to the side; on success it replaces ``target`` in one rename.

    Yields an empty staging directory ``.<name>.staging-<hex>`` beside ``target`` (same
    filesystem, which matters on Lustre/NFS where rename is only atomic within one). On a
    clean exit the tree is fsynced and swapped in: a new ``target`` is a plain rename, an
    existing one is exchanged atomically (Linux ``renameat2(RENAME_EXCHANGE)``) and the old
    tree removed. Where the exchange is not supported the old tree is renamed away first, so
    for an instant ``target`` is absent, but never half-written. On an exception the staging
    directory is removed and ``target`` is left as it was; a killed process leaves its
    dot-named staging directory behind instead, for the caller to clean up.

    Args:
        target: The directory to create or replace. Missing parents are created.
        durable: Fsync the staged tree and the parent directory.

    Yields:
        The staging directory to fill.

    Raises:
        OSError: Staging or the swap fails; ``target`` is unchanged.
    """
    target = Path(target).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex[:12]
    staging = target.parent / f".{target.name}.staging-{token}"
    staging.mkdir()
    try:
        yield staging
        if durable:
            fsync_tree(staging)
        _swap_in(staging, target, target.parent / f".{target.name}.old-{token}")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if durable:
        fsync_dir(target.parent)


def _swap_in(staging: Path, target: Path, retired: Path) -> None:
    if not os.path.lexists(target):
        os.rename(staging, target)
        return
    if _exchange(staging, target):
        shutil.rmtree(staging, ignore_errors=True)  # now holds the old tree
        return
    os.rename(target, retired)
    try:
        os.rename(staging, target)
    except BaseException:
        os.rename(retired, target)
        raise
    shutil.rmtree(retired, ignore_errors=True)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}


@functools.cache
def _load_renameat2() -> Callable[..., int] | None:
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    except (OSError, TypeError):  # no C library to load (not a POSIX libc)
        return None


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths; ``False`` where the platform or filesystem cannot."""
    fn = _load_renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in _NO_EXCHANGE:
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


# ---------------------------------------------------------------------------------- manifests


def write_manifest(
    directory: StrPath,
    *,
    version: int = 0,
    step: int = 0,
    producer: str | None = None,
    durable: bool = True,
    recursive: bool = False,
    hash_algorithm: str = SHA256,
) -> Manifest:
    """Hash every file of a directory and write its ``manifest.json``, atomically.

    The format is the one of published adapter versions (``weight-sync/manifest/v1``), so
    ``verify_manifest`` and ``Manifest.from_json`` read it back. Files are fsynced before the
    manifest is written: a manifest on disk means the files it lists are too.

    Args:
        directory: A directory holding only regular files with visible names (no
            subdirectories, no dot-files), at least one.
        version: Recorded as the manifest's version (an integer >= 0).
        step: Recorded as the manifest's step (an integer >= 0).
        producer: Who wrote it; defaults to ``host:pid``.
        durable: Fsync the files, the manifest and the directory.
        recursive: Also list the files of subdirectories, by relative POSIX path (a checkpoint
            tree); directories are fsynced too. Adapter versions stay flat.
        hash_algorithm: The checksum to record: ``sha256`` (readable by every version of this
            package), ``xxh3-128`` (about ten times faster; needs ``xxhash``) or ``auto``
            (``xxh3-128`` where installed).

    Returns:
        The manifest that was written.

    Raises:
        WeightSyncError: The directory holds something a manifest cannot describe, or
            nothing, or ``version``/``step`` is not an integer >= 0.
        OSError: A file cannot be read or the manifest cannot be written.
    """
    path = Path(directory)
    for what, value in (("version", version), ("step", step)):
        if type(value) is not int or value < 0:
            raise WeightSyncError(f"{path}: manifest {what} must be an integer >= 0, got {value!r}")
    alg = resolve(hash_algorithm)
    files: dict[str, FileEntry] = {}
    for name, fpath in _listed_files(path, recursive):
        if durable:
            fsync_file(fpath)
        size, digest = hash_file(fpath, alg)
        files[name] = FileEntry(size, digest)
    if durable and recursive:
        for d in sorted({p.parent for p in path.rglob("*")} - {path}, key=lambda d: -len(d.parts)):
            fsync_dir(d)
    if not files:
        raise WeightSyncError(f"{path}: no files to list in a manifest")
    manifest = Manifest(
        version=version,
        step=step,
        created_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
        producer=producer or f"{socket.gethostname()}:{os.getpid()}",
        files=files,
        hash_algorithm=alg,
    )
    atomic_write_bytes(path / MANIFEST_NAME, manifest.to_json(), durable=durable)
    return manifest


def _listed_files(path: Path, recursive: bool, *, top: bool = True) -> list[tuple[str, Path]]:
    # Only the top-level manifest describes the tree; a nested one (a consolidated adapter's) is
    # content like any other file.
    out: list[tuple[str, Path]] = []
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if top and entry.name == MANIFEST_NAME:
            continue
        if recursive and entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."):
            out.extend(
                (f"{entry.name}/{name}", fpath)
                for name, fpath in _listed_files(Path(entry.path), recursive, top=False)
            )
            continue
        if not entry.is_file(follow_symlinks=False) or not (
            valid_file_name(entry.name) or (not top and entry.name == MANIFEST_NAME)
        ):
            raise WeightSyncError(
                f"{entry.path}: a manifest lists only regular files with visible names"
            )
        out.append((entry.name, Path(entry.path)))
    return out


def _present(path: Path, nested: bool) -> set[str]:
    if not nested:
        return {n for n in os.listdir(path) if n != MANIFEST_NAME}
    if not path.is_dir():
        raise FileNotFoundError(path)
    return {
        p.relative_to(path).as_posix()
        for p in path.rglob("*")
        if not p.is_dir() and p.relative_to(path).as_posix() != MANIFEST_NAME
    }


def read_manifest(directory: StrPath) -> Manifest:
    """Read and strictly parse ``directory/manifest.json``.

    Args:
        directory: The directory the manifest describes.

    Returns:
        The parsed manifest (its files are not checked; see ``verify_manifest``).

    Raises:
        VerificationError: The manifest is missing, unreadable or malformed.
    """
    mpath = Path(directory) / MANIFEST_NAME
    try:
        raw = mpath.read_bytes()
    except OSError as exc:
        raise VerificationError(f"{mpath}: cannot read manifest ({exc.strerror})") from None
    return Manifest.from_json(raw, str(mpath))


_cache_lock = threading.Lock()


def verify_manifest(
    directory: StrPath,
    manifest: Manifest | None = None,
    *,
    cache: VerifyCache | None = None,
) -> Manifest:
    """Check that ``directory`` holds exactly the manifest's files with their size and checksum.

    Files are hashed in place through ``mmap`` (no copy into a buffer), with the algorithm the
    manifest names; ``sha256`` for manifests that name none.

    Args:
        directory: The directory to check.
        manifest: What it must hold; read from ``directory/manifest.json`` when ``None``.
        cache: Filled with and consulted for ``(path, inode, size, mtime_ns, ctime_ns)`` ->
            digest, so files unchanged since they last verified are not re-read. Share one
            dict between threads freely.

    Returns:
        The manifest the directory matched.

    Raises:
        VerificationError: The manifest is missing or malformed, a listed file is missing, an
            unlisted file is present, or a size or checksum differs.
        VersionNotFoundError: The directory or one of its files vanished while being checked
            (a concurrent removal rather than damage).
    """
    path = Path(directory)
    if manifest is None:
        manifest = read_manifest(path)
    try:
        present = _present(path, any("/" in name for name in manifest.files))
    except FileNotFoundError:
        raise VersionNotFoundError(f"{path}: removed while verifying") from None
    missing = sorted(set(manifest.files) - present)
    if missing:
        raise VerificationError(f"{path}: file {missing[0]!r} in the manifest is missing")
    extra = sorted(present - set(manifest.files))
    if extra:
        raise VerificationError(f"{path}: file {extra[0]!r} is not in the manifest")
    for name, entry in sorted(manifest.files.items()):
        _verify_file(path / name, entry, manifest.hash_algorithm, cache)
    return manifest


def _verify_file(fpath: Path, entry: FileEntry, alg: str, cache: VerifyCache | None) -> None:
    try:
        st = os.stat(fpath)
    except FileNotFoundError:
        raise VersionNotFoundError(f"{fpath}: removed while verifying") from None
    if st.st_size != entry.size:
        raise VerificationError(
            f"{fpath}: size {st.st_size} != {entry.size} recorded in the manifest"
        )
    key = (str(fpath), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    tagged = f"{alg}:{entry.digest}"
    if cache is not None:
        with _cache_lock:
            if cache.get(key) == tagged:
                return
    try:
        # Mapped in place: manifested files are complete and nobody truncates them.
        size, digest = hash_path_mapped(fpath, alg)
    except FileNotFoundError:
        raise VersionNotFoundError(f"{fpath}: removed while verifying") from None
    if size != entry.size or digest != entry.digest:
        raise VerificationError(
            f"{fpath}: {alg} {digest[:16]}... (size {size}) does not match the manifest"
            f" ({entry.digest[:16]}..., size {entry.size})"
        )
    if cache is not None:
        with _cache_lock:
            cache[key] = tagged
