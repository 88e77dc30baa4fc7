"""Hash-while-writing copies for publishing; the public primitives are in ``weight_sync.fs``."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from weight_sync._hashing import hash_mapped, new_hasher
from weight_sync.errors import InvalidAdapterError, StorageFullError

CHUNK = 8 << 20
# Start writeback of a file being written once this many bytes are dirty, so the final fsync
# only has the tail left; this overlaps disk I/O with hashing instead of paying it at the end.
FLUSH_EVERY = 32 << 20

WriteHook = Callable[[str, int], None]
"""Called as ``hook(file_name, bytes_written_so_far)`` before every chunk is written.

It may raise ``OSError`` (for example ``ENOSPC``) to inject faults in tests.
"""

_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}


_pools: dict[int, ThreadPoolExecutor] = {}


def _executor() -> ThreadPoolExecutor:
    # One worker hashes, one flushes; the hashes and fdatasync release the GIL on big buffers.
    # Keyed by pid: a forked child inherits this dict but not the worker threads behind it.
    pid = os.getpid()
    pool = _pools.get(pid)
    if pool is None:
        pool = _pools.setdefault(
            pid, ThreadPoolExecutor(max_workers=2, thread_name_prefix="weight-sync-io")
        )
    return pool


def is_no_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _NO_SPACE


def storage_full(exc: OSError, what: str) -> StorageFullError:
    return StorageFullError(f"no space left on device while writing {what}: {exc.strerror}")


def write_all(fd: int, view: memoryview) -> None:
    while view:
        n = os.write(fd, view)
        view = view[n:]


class _HashingWriter:
    """Writes chunks to ``fd`` while a worker thread hashes the very same bytes."""

    def __init__(
        self, fd: int, name: str, hook: WriteHook | None, durable: bool, algorithm: str
    ) -> None:
        self._fd = fd
        self._name = name
        self._hook = hook
        self._durable = durable
        self._hash = new_hasher(algorithm)
        self._pending: Future[object] | None = None
        self._flush: Future[None] | None = None
        self._dirty = 0
        self.size = 0

    def wait_hash(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def write(self, view: memoryview) -> None:
        """Hash and write ``view``; the caller must not reuse its buffer before ``wait_hash``."""
        if self._hook is not None:
            self._hook(self._name, self.size)
        self.wait_hash()
        self._pending = _executor().submit(self._hash.update, view)
        write_all(self._fd, view)
        self.size += len(view)
        self._dirty += len(view)
        if (
            self._durable
            and self._dirty >= FLUSH_EVERY
            and (self._flush is None or self._flush.done())
        ):
            if self._flush is not None:
                self._flush.result()
            self._flush = _executor().submit(os.fdatasync, self._fd)
            self._dirty = 0

    def finish(self) -> str:
        self.wait_hash()
        if self._flush is not None:
            self._flush.result()
        if self._durable:
            os.fsync(self._fd)
        return self._hash.hexdigest()

    def abort(self) -> None:
        # Never leave a worker touching a buffer the caller is about to drop.
        try:
            self.wait_hash()
        finally:
            if self._flush is not None:
                self._flush.exception()


class _MappedHasher:
    """Hashes consecutive ranges of the file just written, in place in the page cache.

    The destination is hashed rather than the source: it is a staging file only this process
    writes, so mapping it is safe (a source truncated by someone else mid-publish would raise
    ``SIGBUS`` through a mapping), and the digest then covers exactly the published bytes.
    """

    def __init__(self, fd: int, algorithm: str) -> None:
        self._fd = fd
        self.hash = new_hasher(algorithm)

    def update(self, offset: int, count: int) -> None:
        hash_mapped(self._fd, offset, count, self.hash)


class _KernelCopy:
    """Copy byte ranges between fds in the kernel (no userspace buffer), with fallbacks."""

    def __init__(self, fin: int, fout: int) -> None:
        self._fin = fin
        self._fout = fout
        self._mode = "copy_file_range" if hasattr(os, "copy_file_range") else "sendfile"

    def copy(self, offset: int, count: int) -> int:
        if self._mode == "copy_file_range":
            try:
                return os.copy_file_range(self._fin, self._fout, count, offset, offset)
            except OSError as exc:
                if exc.errno not in _NO_KERNEL_COPY:
                    raise
                self._mode = "sendfile"
        if self._mode == "sendfile":
            try:
                os.lseek(self._fout, offset, os.SEEK_SET)
                return os.sendfile(self._fout, self._fin, offset, count)
            except OSError as exc:
                if exc.errno not in _NO_KERNEL_COPY:
                    raise
                self._mode = "pread"
        data = os.pread(self._fin, count, offset)
        _write_all_at(self._fout, memoryview(data), offset)
        return len(data)


_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP}


def _write_all_at(fd: int, view: memoryview, offset: int) -> None:
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def copy_hashed(
    src: Path,
    dst: Path,
    name: str,
    *,
    hook: WriteHook | None,
    durable: bool,
    algorithm: str = "sha256",
) -> tuple[int, str]:
    """Copy ``src`` to a new file ``dst``; return ``(size, hex digest in algorithm)``.

    One pass: the kernel copies each chunk (``copy_file_range``, no userspace copy) while a
    worker thread hashes the previous chunk of the destination, still hot in the page cache
    and read in place through ``mmap``. The source must not change during the copy: a change
    of size, mtime or ctime is an error (and readers re-verify anyway).
    """
    fin = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        before = os.fstat(fin)
        # Read-write: the hasher maps the destination, which needs a readable descriptor.
        fd = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            digest = _copy_into(
                fin, fd, before.st_size, src, name, hook=hook, durable=durable, algorithm=algorithm
            )
        finally:
            os.close(fd)
        after = os.fstat(fin)
    finally:
        os.close(fin)
    if (before.st_size, before.st_mtime_ns, before.st_ctime_ns) != (
        after.st_size,
        after.st_mtime_ns,
        after.st_ctime_ns,
    ):
        raise InvalidAdapterError(f"{src}: modified while being published")
    return before.st_size, digest


def _copy_into(
    fin: int,
    fd: int,
    size: int,
    src: Path,
    name: str,
    *,
    hook: WriteHook | None,
    durable: bool,
    algorithm: str,
) -> str:
    hasher = _MappedHasher(fd, algorithm)
    flush: Future[None] | None = None
    pending: Future[None] | None = None
    kcopy = _KernelCopy(fin, fd)
    pool = _executor()
    try:
        off = 0
        dirty = 0
        while off < size:
            if hook is not None:
                hook(name, off)
            count = min(CHUNK, size - off)
            n = 0
            while n < count:
                k = kcopy.copy(off + n, count - n)
                if k == 0:
                    break
                n += k
            if n != count:
                raise InvalidAdapterError(f"{src}: shrank while being copied")
            if pending is not None:
                pending.result()  # chunks are fed to the hash in order, one at a time
            pending = pool.submit(hasher.update, off, count)
            off += n
            dirty += n
            if durable and dirty >= FLUSH_EVERY and (flush is None or flush.done()):
                if flush is not None:
                    flush.result()
                flush = pool.submit(os.fdatasync, fd)
                dirty = 0
        if os.pread(fin, 1, size):
            raise InvalidAdapterError(f"{src}: grew while being copied")
        if pending is not None:
            pending.result()
            pending = None
        if flush is not None:
            flush.result()
            flush = None
        if durable:
            os.fsync(fd)
    finally:
        # Never let the caller close the fds under a running worker.
        for fut in (pending, flush):
            if fut is not None:
                fut.exception()
    return hasher.hash.hexdigest()


def write_hashed(
    data: bytes | bytearray | memoryview,
    dst: Path,
    name: str,
    *,
    hook: WriteHook | None,
    durable: bool,
    algorithm: str = "sha256",
) -> tuple[int, str]:
    """Write ``data`` to a new file ``dst``; return ``(size, hex digest in algorithm)``."""
    view = memoryview(data).cast("B")
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    writer = _HashingWriter(fd, name, hook, durable, algorithm)
    try:
        for off in range(0, len(view), CHUNK):
            writer.write(view[off : off + CHUNK])
        digest = writer.finish()
    except BaseException:
        writer.abort()
        raise
    finally:
        os.close(fd)
    return writer.size, digest
