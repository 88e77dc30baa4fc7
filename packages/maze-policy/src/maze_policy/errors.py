"""maze-policy's errors: one root, so callers can catch everything this package raises."""

from __future__ import annotations


class MazePolicyError(Exception):
    """Root of every error maze-policy raises."""


class ModelLoadError(MazePolicyError, RuntimeError):
    """A model directory that cannot be loaded; the message names the path and what is wrong."""


class ChatEncodingError(MazePolicyError, ValueError):
    """A conversation, image or reply that cannot be encoded for the model."""


class TokenizerError(MazePolicyError):
    """The in-process tokenizer could not be built as configured."""


class AdapterMismatchError(MazePolicyError, ValueError):
    """An adapter whose weights do not fit the model it is loaded into."""


class ContextRecordError(MazePolicyError, ValueError):
    """An adapter's ``maze_context.json`` that cannot be read or names no known context."""
