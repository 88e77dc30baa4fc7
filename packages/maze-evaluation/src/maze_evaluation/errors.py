"""maze-evaluation's errors: one root, each naming the file, key or endpoint at fault."""

from __future__ import annotations


class EvaluationError(Exception):
    """Root of every error maze-evaluation raises for failures that are not low scores."""


class ResultsFileError(EvaluationError, ValueError):
    """A results JSONL that cannot be read or does not belong to this run."""


class EndpointError(EvaluationError, RuntimeError):
    """An OpenAI-compatible endpoint kept failing after retries, or refused the request."""


class BackendError(EvaluationError, RuntimeError):
    """A backend that cannot be set up (missing extra, bad model or adapter directory)."""
