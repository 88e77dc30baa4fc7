"""Typed serving errors; each maps to one HTTP status and an OpenAI-style error body.

:class:`ServingError` is the root of every error this package raises.
"""

from __future__ import annotations

from typing import Any


class ServingError(Exception):
    """Root of maze-serving's errors: ``status`` is the HTTP status, ``type`` the error type.

    Args:
        message: What went wrong, as the client will read it.
        retry_after: Seconds for the ``Retry-After`` header, if the client should retry.
    """

    status: int = 500
    type: str = "internal_error"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        """The OpenAI error body.

        Returns:
            ``{"error": {"message", "type", "code"}}``.
        """
        return {"error": {"message": self.message, "type": self.type, "code": self.status}}


class BadRequestError(ServingError):
    """Malformed or unsupported input (400)."""

    status = 400
    type = "invalid_request_error"


class ModelNotFoundError(ServingError):
    """Unknown model name, adapter name or adapter path (404)."""

    status = 404
    type = "not_found_error"


class SourceError(ModelNotFoundError):
    """An S3 location that cannot be read or holds nothing (404)."""


class PayloadTooLargeError(ServingError):
    """A body or image over the server's limits (413)."""

    status = 413
    type = "payload_too_large"


class OverloadedError(ServingError):
    """More admitted requests than ``max_pending`` (429)."""

    status = 429
    type = "rate_limit_error"


class NotReadyError(ServingError):
    """The model is still loading, or failed to load (503)."""

    status = 503
    type = "service_unavailable"


class RequestTimeoutError(ServingError):
    """A generation that did not finish within ``request_timeout_s`` (504)."""

    status = 504
    type = "timeout"


class StartupError(ServingError):
    """A server started in-process did not come up, or its model did not load, in time."""
