"""Write one file from a stream of byte pieces and hash it in the same pass (``_hashing``).

Pieces are bytes in memory or ranges of other (already open) files. They are packed into a small
ring of fixed-size buffers: file ranges are ``preadv``-ed straight into a buffer, so a shard's
bytes are copied once from the page cache, and no piece is ever held whole. Each full buffer goes
to two worker threads, one hashing and one writing it, while the caller fills the next:
``hashlib``, ``os.write`` and ``preadv`` release the GIL, so reading, hashing and writing overlap.
Memory is the ring (``depth * chunk`` bytes), whatever the file size.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from lora_consolidate._hashing import SHA256, new_hasher
from lora_consolidate.errors import ShardError

CHUNK = 512 << 10
DEPTH = 2
# Start writeback every so often while writing (on a third thread, overlapping the rest), so the
# fsync at the end only has the tail left.
FLUSH_EVERY = 32 << 20

_pools: dict[int, tuple[ThreadPoolExecutor, ...]] = {}


def _workers() -> tuple[ThreadPoolExecutor, ...]:
    # (hash, write, flush). A single-thread executor keeps every writer's chunks in order.
    # Keyed by pid: a forked child inherits the dict but not the threads behind it.
    pid = os.getpid()
    pools = _pools.get(pid)
    if pools is None:
        pools = _pools.setdefault(
            pid,
            tuple(
                ThreadPoolExecutor(1, thread_name_prefix=f"lora-consolidate-{role}")
                for role in ("hash", "write", "flush")
            ),
        )
    return pools


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        n = os.write(fd, view)
        view = view[n:]


class ChunkedWriter:
    """Appends pieces to ``fd`` through a ring of buffers; :meth:`finish` returns size and digest.

    Use as a context manager (or call :meth:`abort` on error) so no worker still touches a
    buffer when the caller moves on.
    """

    def __init__(
        self,
        fd: int,
        *,
        algorithm: str = SHA256,
        durable: bool = True,
        chunk: int = CHUNK,
        depth: int = DEPTH,
    ) -> None:
        self._fd = fd
        self._durable = durable
        self._chunk = chunk
        self._free: deque[memoryview] = deque(memoryview(bytearray(chunk)) for _ in range(depth))
        self._inflight: deque[tuple[memoryview, Future[object], Future[None]]] = deque()
        self._hash = new_hasher(algorithm)
        self._buf: memoryview | None = None
        self._fill = 0
        self._size = 0
        self._since_flush = 0
        self._flush: Future[None] | None = None

    def __enter__(self) -> ChunkedWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.abort()

    def _take(self) -> memoryview:
        if self._buf is None:
            if not self._free:
                self._reclaim()
            self._buf = self._free.popleft()
            self._fill = 0
        return self._buf

    def _reclaim(self) -> None:
        buf, hashed, written = self._inflight.popleft()
        hashed.result()
        written.result()
        self._free.append(buf)

    def _write_chunk(self, view: memoryview) -> None:
        _write_all(self._fd, view)
        self._since_flush += len(view)
        flush = self._flush
        if self._durable and self._since_flush >= FLUSH_EVERY and (flush is None or flush.done()):
            if flush is not None:
                flush.result()
            self._flush = _workers()[2].submit(os.fdatasync, self._fd)
            self._since_flush = 0

    def _submit(self) -> None:
        buf, fill = self._buf, self._fill
        if buf is None or fill == 0:
            return
        view = buf[:fill]
        hasher, writer, _ = _workers()
        # Hashing and writing read the same buffer at once; it is reused when both are done.
        self._inflight.append(
            (buf, hasher.submit(self._hash.update, view), writer.submit(self._write_chunk, view))
        )
        self._size += fill
        self._buf = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes (copied into the ring; the caller may reuse ``data`` at once)."""
        view = memoryview(data).cast("B")
        while view:
            buf = self._take()
            n = min(len(view), self._chunk - self._fill)
            buf[self._fill : self._fill + n] = view[:n]
            self._fill += n
            view = view[n:]
            if self._fill == self._chunk:
                self._submit()

    def copy_range(
        self, fd: int, offset: int, nbytes: int, *, where: Path, key: str | None = None
    ) -> None:
        """Append ``nbytes`` of file ``fd`` from ``offset``; a short file is a ``ShardError``."""
        while nbytes:
            buf = self._take()
            n = min(nbytes, self._chunk - self._fill)
            got = os.preadv(fd, [buf[self._fill : self._fill + n]], offset)
            if got <= 0:
                raise ShardError(where, "file ends inside tensor data (truncated?)", key=key)
            self._fill += got
            offset += got
            nbytes -= got
            if self._fill == self._chunk:
                self._submit()

    def finish(self) -> tuple[int, str]:
        """Write what is buffered, wait for the workers; return (bytes written, hex digest)."""
        self._submit()
        while self._inflight:
            self._reclaim()
        if self._flush is not None:
            self._flush.result()
        return self._size, self._hash.hexdigest()

    def abort(self) -> None:
        """Wait for every queued chunk (errors ignored): afterwards no thread uses the ring."""
        while self._inflight:
            _, hashed, written = self._inflight.popleft()
            hashed.exception()
            written.exception()
        if self._flush is not None:
            self._flush.exception()
