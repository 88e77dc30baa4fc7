"""The publisher lock: ``flock`` on ``R/.publish.lock``.

``flock`` is released by the kernel when the holder dies (even by SIGKILL), so a crashed
publisher never leaves a stale lock behind. On Lustre, mount the clients with ``-o flock``
so the lock is coherent across nodes (``localflock`` only excludes publishers on one node).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from types import TracebackType

from weight_sync.errors import PublisherBusyError, WeightSyncError

LOCK_NAME = ".publish.lock"


class PublisherLock:
    def __init__(self, root: Path, *, timeout: float, purpose: str) -> None:
        self._path = root / LOCK_NAME
        self._timeout = timeout
        self._purpose = purpose
        self._fd: int | None = None

    def __enter__(self) -> PublisherLock:
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _read_holder(fd)
                    os.close(fd)
                    raise PublisherBusyError(
                        f"{self._path}: another publisher holds the lock ({holder}); "
                        f"refusing to {self._purpose}"
                    ) from None
                time.sleep(0.02)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK):
                    raise WeightSyncError(
                        f"{self._path}: filesystem does not support flock ({exc.strerror}); "
                        "on Lustre mount with -o flock"
                    ) from None
                raise
        # Who holds it, for the error message another publisher will print.
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the last descriptor releases the flock


def _read_holder(fd: int) -> str:
    try:
        raw = os.pread(fd, 4096, 0)
        info = json.loads(raw)
        return f"pid {info['pid']} on {info['host']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"
