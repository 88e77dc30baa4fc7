"""Optional mirror of finished checkpoints to S3, so a run survives the loss of its filesystem.

Uploads happen after a checkpoint is complete and verified on disk; the manifest goes last, so
a reader of the bucket can tell a complete copy from an interrupted upload.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from maze_engine.errors import ConfigError


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of ``s3://bucket/prefix``; a malformed URI is a :class:`ConfigError`."""
    if not uri.startswith("s3://"):
        raise ConfigError(
            f"must look like s3://bucket/prefix, got {uri!r}", key="local.ckpt_s3_uri"
        )
    bucket, _, prefix = uri[5:].partition("/")
    if not bucket:
        raise ConfigError(f"has no bucket: {uri!r}", key="local.ckpt_s3_uri")
    return bucket, prefix.strip("/")


def mirror_checkpoint(path: Path, uri: str, client: Any = None) -> list[str]:
    """Upload ``path`` (a ``global_step_N`` directory) under ``uri``; returns the object keys."""
    import boto3

    bucket, prefix = parse_s3_uri(uri)
    s3: Any = client or boto3.client("s3")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    files = sorted(p for p in path.rglob("*") if p.is_file())
    files.sort(key=lambda p: p.name == "manifest.json")  # manifest last
    keys: list[str] = []
    for f in files:
        key = "/".join(x for x in (prefix, path.name, str(f.relative_to(path))) if x)
        s3.upload_file(str(f), bucket, key)
        keys.append(key)
    return keys
