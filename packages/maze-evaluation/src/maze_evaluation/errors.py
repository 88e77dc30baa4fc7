"""Typed errors: each names the file, key or endpoint at fault."""

from __future__ import annotations


class EvaluationError(RuntimeError):
    """Base class for evaluation failures that are not low scores."""


class ResultsFileError(EvaluationError, ValueError):
    """A results JSONL that cannot be read or does not belong to this run."""


class EndpointError(EvaluationError):
    """An OpenAI-compatible endpoint kept failing after retries, or refused the request."""


class BackendError(EvaluationError):
    """A backend that cannot be set up (missing extra, bad model or adapter directory)."""
