"""``S3Mirror``: copy published versions to S3 and back into a verified local cache.

Key layout mirrors the store: ``<prefix>/versions/v000000123/<file>`` (manifest uploaded
after the files) and ``<prefix>/latest`` (uploaded last, only ever moved forward).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, cast

from weight_sync._fsutil import CHUNK, is_no_space, storage_full
from weight_sync._hashing import new_hasher
from weight_sync.errors import MirrorError, VerificationError
from weight_sync.fs import fsync_dir, verify_manifest
from weight_sync.manifest import MANIFEST_NAME, Manifest, Pointer, version_dir_name
from weight_sync.store import LATEST, PublishedVersion

_MISSING = {"NoSuchKey", "404", "NotFound"}


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
