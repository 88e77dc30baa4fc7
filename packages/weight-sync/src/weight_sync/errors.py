"""Typed errors. Every failure names the file, key or version it is about."""

from __future__ import annotations


class WeightSyncError(Exception):
    """Base class of every error this package raises on purpose."""


class InvalidAdapterError(WeightSyncError):
    """The publish source is not a usable PEFT adapter (missing/empty/corrupt file)."""


class VersionConflictError(WeightSyncError):
    """A publish would not move the version forward (older, equal or already present)."""


class PublisherBusyError(WeightSyncError):
    """Another publisher holds the store's publish lock."""


class VersionNotFoundError(WeightSyncError):
    """The requested version is not published (never was, not yet, or garbage-collected)."""


class VerificationError(WeightSyncError):
    """A published version does not match its manifest (torn, corrupt or lying manifest)."""


class StorageFullError(WeightSyncError):
    """The filesystem ran out of space (ENOSPC/EDQUOT) while writing a version."""


class LeaseError(WeightSyncError):
    """A reader lease could not be taken or renewed."""


class NotifyError(WeightSyncError):
    """The inference server rejected or did not answer a load-adapter request."""


class MirrorError(WeightSyncError):
    """The S3 mirror failed (missing object, bad manifest, transport error)."""
