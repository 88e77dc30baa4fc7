"""``S3Mirror``: copy published versions to S3 and back into a verified local cache.

``BackgroundMirror`` copies any finished directory (a checkpoint, an adapter) on a thread of its
own, retrying failures without ever raising into the caller.

Key layout mirrors the store: ``<prefix>/versions/v000000123/<file>`` (manifest uploaded
after the files) and ``<prefix>/latest`` (uploaded last, only ever moved forward).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from weight_sync._fsutil import CHUNK, is_no_space, storage_full
from weight_sync._hashing import new_hasher
from weight_sync.errors import MirrorError, VerificationError
from weight_sync.fs import fsync_dir, verify_manifest
from weight_sync.manifest import MANIFEST_NAME, Manifest, Pointer, version_dir_name
from weight_sync.store import LATEST, PublishedVersion

_MISSING = {"NoSuchKey", "404", "NotFound"}
_LOG = logging.getLogger("weight_sync.s3")


class S3Mirror:
    """Mirror of an ``AdapterStore`` in ``s3://bucket/prefix``.

    ``client`` is a boto3 S3 client (default: ``boto3.client("s3")``, needs the ``s3`` extra).
    """

    def __init__(self, bucket: str, prefix: str = "", client: Any = None) -> None:
        if client is None:
            try:
                import boto3  # optional extra
            except ImportError as exc:
                raise MirrorError("S3Mirror needs boto3: pip install 'weight-sync[s3]'") from exc
            client = cast(Any, boto3.client("s3"))
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client: Any = client

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def _url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def upload(self, pv: PublishedVersion) -> list[str]:
        """Upload a (verified) published version; returns the keys written."""
        from botocore.exceptions import BotoCoreError, ClientError

        vdir = version_dir_name(pv.version)
        keys: list[str] = []
        try:
            for name in sorted(pv.manifest.files):
                key = self.key("versions", vdir, name)
                self.client.upload_file(str(pv.path / name), self.bucket, key)
                keys.append(key)
            mraw = (pv.path / MANIFEST_NAME).read_bytes()
            key = self.key("versions", vdir, MANIFEST_NAME)
            self.client.put_object(Bucket=self.bucket, Key=key, Body=mraw)
            keys.append(key)
            remote = self.remote_pointer()
            if remote is None or remote.version < pv.version:
                ptr = Pointer(pv.version, hashlib.sha256(mraw).hexdigest(), time.time())
                self.client.put_object(Bucket=self.bucket, Key=self.key(LATEST), Body=ptr.to_json())
                keys.append(self.key(LATEST))
        except (BotoCoreError, ClientError) as exc:
            url = self._url(self.key())
            raise MirrorError(f"upload of version {pv.version} to {url}: {exc}") from None
        except OSError as exc:
            raise MirrorError(f"upload of version {pv.version}: {exc}") from exc
        return keys

    def remote_pointer(self) -> Pointer | None:
        raw = self._get_bytes(self.key(LATEST), missing_ok=True)
        return None if raw is None else Pointer.from_json(raw, self._url(self.key(LATEST)))

    def remote_latest(self) -> int | None:
        ptr = self.remote_pointer()
        return None if ptr is None else ptr.version

    def _get_bytes(self, key: str, *, missing_ok: bool = False) -> bytes | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            resp: Any = self.client.get_object(Bucket=self.bucket, Key=key)
            body: bytes = resp["Body"].read()
            return body
        except ClientError as exc:
            response: Any = exc.response
            code = str(response.get("Error", {}).get("Code", ""))
            if code in _MISSING:
                if missing_ok:
                    return None
                raise MirrorError(f"{self._url(key)}: no such object") from None
            raise MirrorError(f"{self._url(key)}: {exc}") from None
        except BotoCoreError as exc:
            raise MirrorError(f"{self._url(key)}: {exc}") from None

    def download(
        self, cache_dir: str | os.PathLike[str], version: int | None = None
    ) -> PublishedVersion:
        """Download ``version`` (default: the remote latest) into ``cache_dir/v.../``.

        Every file is hashed while it streams in and checked against the manifest before the
        directory is renamed into place; an already cached, still valid copy is reused.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        cache = Path(cache_dir)
        ptr = self.remote_pointer()
        if version is None:
            if ptr is None:
                raise MirrorError(f"{self._url(self.key(LATEST))}: nothing published")
            version = ptr.version
        vdir = version_dir_name(version)
        mkey = self.key("versions", vdir, MANIFEST_NAME)
        mraw = self._get_bytes(mkey)
        assert mraw is not None
        if (
            ptr is not None
            and ptr.version == version
            and hashlib.sha256(mraw).hexdigest() != ptr.manifest_sha256
        ):
            raise VerificationError(f"{self._url(mkey)}: sha256 does not match remote latest")
        manifest = Manifest.from_json(mraw, self._url(mkey))
        if manifest.version != version:
            raise VerificationError(
                f"{self._url(mkey)}: manifest is for version {manifest.version}"
            )
        target = cache / vdir
        result = PublishedVersion(version, manifest.step, target, manifest)
        if target.is_dir():
            try:
                if (target / MANIFEST_NAME).read_bytes() == mraw:
                    verify_manifest(target, manifest)
                    return result
            except (OSError, VerificationError):
                pass
            shutil.rmtree(target, ignore_errors=True)  # stale or damaged cache entry
        staging = cache / ".staging" / uuid.uuid4().hex
        try:
            staging.mkdir(parents=True)
            for name, entry in sorted(manifest.files.items()):
                key = self.key("versions", vdir, name)
                resp = self.client.get_object(Bucket=self.bucket, Key=key)
                h = new_hasher(manifest.hash_algorithm)
                size = 0
                with open(staging / name, "wb") as f:
                    for chunk in resp["Body"].iter_chunks(CHUNK):
                        h.update(chunk)
                        f.write(chunk)
                        size += len(chunk)
                    f.flush()
                    os.fsync(f.fileno())
                if size != entry.size or h.hexdigest() != entry.digest:
                    raise VerificationError(
                        f"{self._url(key)}: downloaded {size} bytes with "
                        f"{manifest.hash_algorithm} {h.hexdigest()[:16]}..., manifest says "
                        f"{entry.size} / {entry.digest[:16]}..."
                    )
            (staging / MANIFEST_NAME).write_bytes(mraw)
            fsync_dir(staging)
            try:
                os.rename(staging, target)
            except OSError:
                # Another downloader won the race; keep theirs if it is valid.
                verify_manifest(target, manifest)
        except ClientError as exc:
            raise MirrorError(f"download of version {version}: {exc}") from None
        except BotoCoreError as exc:
            raise MirrorError(f"download of version {version}: {exc}") from None
        except OSError as exc:
            if is_no_space(exc):
                raise storage_full(exc, str(staging)) from exc
            raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return result


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of ``s3://bucket/prefix``.

    Raises:
        MirrorError: ``uri`` is not an ``s3://`` URI with a bucket.
    """
    if not uri.startswith("s3://"):
        raise MirrorError(f"must look like s3://bucket/prefix, got {uri!r}")
    bucket, _, prefix = uri[5:].partition("/")
    if not bucket:
        raise MirrorError(f"has no bucket: {uri!r}")
    return bucket, prefix.strip("/")


def _default_client() -> Any:
    try:
        import boto3  # optional extra
    except ImportError as exc:
        raise MirrorError("the S3 mirror needs boto3: pip install 'weight-sync[s3]'") from exc
    return cast(Any, boto3.client("s3"))


def upload_tree(client: Any, bucket: str, prefix: str, root: Path) -> list[str]:
    """Upload every file under ``root`` to ``prefix/<root name>/<path>``; return the keys.

    A ``manifest.json`` anywhere in the tree goes after every other file, so a reader of the
    bucket can tell a complete copy (manifest present) from an interrupted one.

    Raises:
        MirrorError: A transport, permission or bucket error, or a file that cannot be read.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    files = sorted(p for p in root.rglob("*") if p.is_file())
    files.sort(key=lambda p: p.name == MANIFEST_NAME)  # stable: manifests last, in path order
    keys: list[str] = []
    try:
        for f in files:
            key = "/".join(x for x in (prefix, root.name, f.relative_to(root).as_posix()) if x)
            client.upload_file(str(f), bucket, key)
            keys.append(key)
    except (BotoCoreError, ClientError) as exc:
        raise MirrorError(f"upload of {root} to s3://{bucket}/{prefix}: {exc}") from None
    except OSError as exc:
        raise MirrorError(f"upload of {root}: {exc}") from exc
    return keys


@dataclass(frozen=True)
class MirrorStats:
    """What a :class:`BackgroundMirror` has done: uploads, failed attempts, trees still queued."""

    uploaded: int
    failures: int
    pending: int
    last_error: str


class BackgroundMirror:
    """Copies finished directories (checkpoints, adapters) to S3 on a thread of its own.

    Submit a directory once it is complete and safe on the shared filesystem. Uploads run in
    submission order; a failed upload (unreachable endpoint, missing bucket, no credentials, no
    boto3) is logged, counted in :meth:`stats` and retried with exponential backoff, and never
    raises into the caller: losing the mirror must not stop training. :meth:`close` waits a
    bounded time for the queue to drain and logs whatever it leaves behind.

    ``client_factory`` builds the boto3 client on the mirror's thread (default:
    ``boto3.client("s3")``, so credentials and endpoint come from the environment); a factory
    that raises is retried like a failed upload.
    """

    def __init__(
        self,
        uri: str,
        *,
        client_factory: Callable[[], Any] | None = None,
        retry_initial_s: float = 1.0,
        retry_max_s: float = 60.0,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.bucket, self.prefix = parse_s3_uri(uri)
        self.uri = uri
        self._factory = client_factory or _default_client
        self._client: Any = None
        self._retry = (retry_initial_s, retry_max_s)
        self._log = log or _LOG.warning
        self._queue: deque[Path] = deque()
        self._cond = threading.Condition()
        self._stop = False
        self._abandon = False  # set by close() once its wait is over
        self._busy = False
        self._uploaded = 0
        self._failures = 0
        self._last_error = ""
        self._thread = threading.Thread(target=self._run, name="s3-mirror", daemon=True)
        self._thread.start()

    def submit(self, root: Path) -> None:
        """Queue ``root`` (a finished directory) for upload under ``prefix/<root name>/``."""
        with self._cond:
            if self._stop:
                raise MirrorError(f"mirror to {self.uri} is closed")
            self._queue.append(Path(root))
            self._cond.notify_all()

    def stats(self) -> MirrorStats:
        """Counts so far (``pending`` includes an upload in progress)."""
        with self._cond:
            pending = len(self._queue) + int(self._busy)
            return MirrorStats(self._uploaded, self._failures, pending, self._last_error)

    def _run(self) -> None:
        delay = self._retry[0]
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._queue) or self._stop)
                if not self._queue or self._abandon:
                    return
                root = self._queue[0]
                self._busy = True
            try:
                if self._client is None:
                    self._client = self._factory()
                upload_tree(self._client, self.bucket, self.prefix, root)
            except Exception as exc:  # any failure is retried: the mirror never stops a run
                with self._cond:
                    self._failures += 1
                    self._last_error = f"{type(exc).__name__}: {exc}"
                    self._busy = False
                self._log(
                    f"s3 mirror: {root.name} to {self.uri} failed ({self._last_error}); "
                    f"retrying in {delay:.0f} s"
                )
                with self._cond:  # close() cuts the wait short
                    self._cond.wait_for(lambda: self._abandon, timeout=delay)
                delay = min(delay * 2, self._retry[1])
                continue
            delay = self._retry[0]
            with self._cond:
                self._queue.popleft()
                self._uploaded += 1
                self._busy = False
                self._cond.notify_all()

    def close(self, timeout: float = 60.0) -> MirrorStats:
        """Stop taking work, wait up to ``timeout`` s for the queue to drain, then stop.

        Directories still queued are logged by name (they remain on the shared filesystem).
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._queue, timeout=max(0.0, timeout))
            left = [p.name for p in self._queue]
            self._abandon = True
            self._cond.notify_all()
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()) + 5.0)
        if left:
            self._log(f"s3 mirror: not mirrored to {self.uri} before closing: {', '.join(left)}")
        return self.stats()
