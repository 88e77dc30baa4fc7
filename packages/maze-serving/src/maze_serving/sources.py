"""Resolve model and adapter locations: a local directory or an ``s3://bucket/prefix``.

An S3 prefix holding a weight-sync mirror (a ``latest`` key) is fetched with
``weight_sync.S3Mirror`` (hash-verified); any other prefix is copied object by object. boto3
reads ``AWS_ENDPOINT_URL`` / credentials from the environment as usual.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, cast

from maze_serving.errors import BadRequestError, SourceError


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> ``(bucket, prefix)``, the prefix without surrounding slashes.

    Raises:
        BadRequestError: ``url`` is not an ``s3://`` URL or names no bucket.
    """
    if not url.startswith("s3://"):
        raise BadRequestError(f"not an s3:// URL: {url!r}")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not bucket:
        raise BadRequestError(f"s3 URL without a bucket: {url!r}")
    return bucket, prefix.strip("/")


def download_s3_prefix(url: str, cache_dir: str | Path, client: Any = None) -> Path:
    """Copy ``s3://bucket/prefix`` into ``cache_dir`` (a stable per-URL subdirectory); returns it."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = parse_s3_url(url)
    if client is None:
        import boto3

        client = cast(Any, boto3.client("s3"))  # pyright: ignore[reportUnknownMemberType]
    dest = Path(cache_dir) / hashlib.sha256(url.encode()).hexdigest()[:16]
    from weight_sync import S3Mirror, WeightSyncError

    try:
        mirror = S3Mirror(bucket, prefix, client)
        if mirror.remote_pointer() is not None:
            return mirror.download(dest).path
        paginator: Any = client.get_paginator("list_objects_v2")
        keys: list[str] = []
        page: Any
        for page in paginator.paginate(Bucket=bucket, Prefix=f"{prefix}/" if prefix else ""):
            contents: list[Any] = page.get("Contents", [])
            keys += [str(obj["Key"]) for obj in contents]
        if not keys:
            raise SourceError(f"{url}: no objects under this prefix")
        for key in keys:
            rel = key[len(prefix) :].lstrip("/") if prefix else key
            if not rel or rel.endswith("/") or ".." in Path(rel).parts:
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, key, str(target))
    except (BotoCoreError, ClientError, WeightSyncError) as exc:
        raise SourceError(f"{url}: {exc}") from exc
    return dest


def resolve_location(location: str, cache_dir: str | Path, client: Any = None) -> str:
    """A local path for ``location``: itself, or the download of an ``s3://`` prefix."""
    if location.startswith("s3://"):
        return str(download_s3_prefix(location, cache_dir, client))
    return location
