"""``Subscriber``: wait for the newest complete, verified version and hand it over."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType

from weight_sync._inotify import FileWatcher
from weight_sync.errors import VerificationError, VersionNotFoundError, WeightSyncError
from weight_sync.store import LATEST, AdapterStore, Lease, PublishedVersion

log = logging.getLogger(__name__)


class Subscriber:
    """Follows ``store``'s ``latest`` pointer.

    Every version is fully re-hashed before it is handed over (no cache), and a version that
    fails verification is skipped (see ``last_error``) until a newer one appears. inotify
    wakes the subscriber at once for local publishes; ``poll_interval`` is the safety net for
    publishers on other nodes, where shared filesystems deliver no inotify events.

    With ``reader`` set, the handed-over version is pinned by a lease (renewed on every
    check, released when the next version is handed over or on ``close``), so ``gc`` keeps it.
    """

    def __init__(
        self,
        store: AdapterStore,
        *,
        poll_interval: float = 0.5,
        use_inotify: bool = True,
        reader: str | None = None,
        lease_ttl: float = 600.0,
    ) -> None:
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0, got {poll_interval}")
        self.store = store
        self.poll_interval = poll_interval
        self.reader = reader
        self.lease_ttl = lease_ttl
        self.last_error: WeightSyncError | None = None
        self.noticed_at: float | None = None
        """Wall-clock time the last handed-over version was first seen in ``latest``."""
        self._watcher = FileWatcher(store.root, LATEST, use_inotify=use_inotify)
        self._lease: Lease | None = None
        self._bad: set[tuple[int, str]] = set()

    @property
    def uses_inotify(self) -> bool:
        return self._watcher.uses_inotify

    def wait_for_newer(
        self, than: int | None = None, timeout: float | None = None
    ) -> PublishedVersion | None:
        """The newest verified version with number > ``than`` (any if None); None on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            pv = self._check(than)
            if pv is not None:
                return pv
            wait = self.poll_interval
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return None
            self._watcher.wait(wait)

    def _check(self, than: int | None) -> PublishedVersion | None:
        if self._lease is not None and self._lease.expires_at - time.time() < self.lease_ttl / 2:
            try:
                self._lease.renew(self.lease_ttl)
            except WeightSyncError as exc:
                log.warning("could not renew lease: %s", exc)
        try:
            ptr = self.store.pointer()
        except WeightSyncError as exc:
            self.last_error = exc
            return None
        if ptr is None or (than is not None and ptr.version <= than):
            return None
        if (ptr.version, ptr.manifest_sha256) in self._bad:
            return None
        noticed = time.time()
        lease = None
        try:
            if self.reader is not None:
                lease = self.store.pin(ptr.version, self.reader, self.lease_ttl)
            pv = self.store.verify(ptr.version, use_cache=False)
        except VerificationError as exc:
            if lease is not None:
                lease.release()
            self._bad.add((ptr.version, ptr.manifest_sha256))
            self.last_error = exc
            log.error("skipping unverifiable version %d: %s", ptr.version, exc)
            return None
        except VersionNotFoundError:
            # Collected or superseded between reading the pointer and opening it: re-read.
            if lease is not None:
                lease.release()
            return None
        if lease is not None:
            if self._lease is not None:
                self._lease.release()
            self._lease = lease
        self.noticed_at = noticed
        return pv

    def iter_versions(
        self,
        after: int | None = None,
        *,
        idle_timeout: float | None = None,
        stop: threading.Event | None = None,
    ) -> Iterator[PublishedVersion]:
        """Yield each newer version as it appears (intermediate ones may be skipped).

        Ends when ``stop`` is set or nothing new arrived for ``idle_timeout`` seconds.
        """
        last = after
        idle_since = time.monotonic()
        while stop is None or not stop.is_set():
            # With a stop event, wake at least every poll interval to look at it.
            wait = self.poll_interval if stop is not None else None
            if idle_timeout is not None:
                remaining = idle_timeout - (time.monotonic() - idle_since)
                if remaining <= 0:
                    return
                wait = remaining if wait is None else min(wait, remaining)
            pv = self.wait_for_newer(last, timeout=wait)
            if pv is None:
                continue
            last = pv.version
            idle_since = time.monotonic()
            yield pv

    def run(
        self,
        callback: Callable[[PublishedVersion], object],
        after: int | None = None,
        *,
        idle_timeout: float | None = None,
        stop: threading.Event | None = None,
        max_versions: int | None = None,
    ) -> int:
        """Call ``callback`` with each newer version; returns how many were handed over."""
        count = 0
        for pv in self.iter_versions(after, idle_timeout=idle_timeout, stop=stop):
            callback(pv)
            count += 1
            if max_versions is not None and count >= max_versions:
                break
        return count

    def close(self) -> None:
        self._watcher.close()
        if self._lease is not None:
            self._lease.release()
            self._lease = None

    def __iter__(self) -> Iterator[PublishedVersion]:
        return self.iter_versions()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
