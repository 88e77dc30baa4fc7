"""Wake-ups when ``R/latest`` is replaced: inotify through ctypes, else plain sleeping.

inotify only reports changes made through the local kernel. On Lustre (or NFS) a publisher on
another node produces no event here, so callers must always poll as well; the watcher only
makes the local case (and the common single-node case) fast.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import struct
import time
from pathlib import Path

IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_Q_OVERFLOW = 0x00004000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name, use_errno=True)
        lib.inotify_init1.argtypes = [ctypes.c_int]
        lib.inotify_init1.restype = ctypes.c_int
        lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        lib.inotify_add_watch.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return lib


class FileWatcher:
    """Wait until a file named ``name`` in ``directory`` is created/replaced, or a timeout."""

    def __init__(self, directory: Path, name: str, *, use_inotify: bool = True) -> None:
        self._name = os.fsencode(name)
        self._fd: int | None = None
        if use_inotify:
            self._fd = _open_inotify(directory)

    @property
    def uses_inotify(self) -> bool:
        return self._fd is not None

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` s; True if an event for the file arrived.

        False may still mean it changed (e.g. remotely), so callers re-check the file either way.
        """
        if self._fd is None:
            time.sleep(max(0.0, timeout))
            return False
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        if not poller.poll(max(0.0, timeout) * 1000.0):
            return False
        return self._drain()

    def _drain(self) -> bool:
        assert self._fd is not None
        hit = False
        while True:
            try:
                buf = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return hit
            off = 0
            while off + _EVENT.size <= len(buf):
                _wd, mask, _cookie, length = _EVENT.unpack_from(buf, off)
                name = buf[off + _EVENT.size : off + _EVENT.size + length].rstrip(b"\0")
                off += _EVENT.size + length
                if mask & IN_Q_OVERFLOW or name == self._name:
                    hit = True

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def _open_inotify(directory: Path) -> int | None:
    lib = _libc()
    if lib is None:
        return None
    fd = int(lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC))
    if fd < 0:
        return None
    mask = IN_MOVED_TO | IN_CLOSE_WRITE | IN_CREATE
    if int(lib.inotify_add_watch(fd, os.fsencode(directory), mask)) < 0:
        os.close(fd)
        return None
    return fd
