"""Atomic, verified publish/subscribe of versioned LoRA adapters on a shared filesystem."""

from weight_sync import fs
from weight_sync.errors import (
    InvalidAdapterError,
    LeaseError,
    MirrorError,
    NotifyError,
    PublisherBusyError,
    StorageFullError,
    VerificationError,
    VersionConflictError,
    VersionNotFoundError,
    WeightSyncError,
)
from weight_sync.manifest import FileEntry, Manifest, Pointer
from weight_sync.notify import notify_vllm
from weight_sync.s3 import BackgroundMirror, MirrorStats, S3Mirror, parse_s3_uri, upload_tree
from weight_sync.store import AdapterStore, GcReport, Lease, LeaseInfo, PublishedVersion
from weight_sync.subscriber import Subscriber

__all__ = [
    "AdapterStore",
    "BackgroundMirror",
    "FileEntry",
    "GcReport",
    "InvalidAdapterError",
    "Lease",
    "LeaseError",
    "LeaseInfo",
    "Manifest",
    "MirrorError",
    "MirrorStats",
    "NotifyError",
    "Pointer",
    "PublishedVersion",
    "PublisherBusyError",
    "S3Mirror",
    "StorageFullError",
    "Subscriber",
    "VerificationError",
    "VersionConflictError",
    "VersionNotFoundError",
    "WeightSyncError",
    "fs",
    "notify_vllm",
    "parse_s3_uri",
    "upload_tree",
]
