"""Typed serving errors; each maps to one HTTP status and an OpenAI-style error body."""

from __future__ import annotations

from typing import Any


class ServingError(Exception):
    """Base class: ``status`` is the HTTP status, ``type``/``code`` go into the error body."""

    status: int = 500
    type: str = "internal_error"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "code": self.status}}


class BadRequestError(ServingError):
    status = 400
    type = "invalid_request_error"


class ModelNotFoundError(ServingError):
    """Unknown model name, adapter name or adapter path."""

    status = 404
    type = "not_found_error"


class PayloadTooLargeError(ServingError):
    status = 413
    type = "payload_too_large"


class OverloadedError(ServingError):
    status = 429
    type = "rate_limit_error"


class NotReadyError(ServingError):
    """The model is still loading (or failed to load)."""

    status = 503
    type = "service_unavailable"


class RequestTimeoutError(ServingError):
    status = 504
    type = "timeout"
