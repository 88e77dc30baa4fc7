"""maze-engine's errors: one root, so a caller can catch everything the engine raises."""

from __future__ import annotations

from collections.abc import Sequence


class MazeEngineError(Exception):
    """Root of every error maze-engine raises."""


def show_value(value: object) -> str:
    """A value as it would be written in the YAML file or an override."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


class ConfigError(MazeEngineError, ValueError):
    """A config file, override or value the engines cannot run; names the key and the allowed values."""

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        allowed: Sequence[object] | None = None,
        source: str | None = None,
    ) -> None:
        self.detail = message
        self.key = key
        self.allowed = tuple(allowed) if allowed is not None else None
        self.source = source
        text = f"{key}: {message}" if key else message
        if self.allowed is not None:
            text += f"; allowed values: {', '.join(show_value(a) for a in self.allowed)}"
        if source:
            text += f" (in {source})"
        super().__init__(text)


class DatasetError(MazeEngineError, ValueError):
    """A dataset file that is missing, unreadable, or lacks the columns the maze env needs."""


class CheckpointError(MazeEngineError, RuntimeError):
    """A checkpoint that cannot be written or used; the message names the path and the reason."""


class AdapterLoadError(MazeEngineError, ValueError):
    """A published adapter a rollout worker cannot load into its model."""


class GpuImageRequiredError(MazeEngineError, RuntimeError):
    """SkyRL training was started where ``skyrl[fsdp]`` (vLLM, flash-attn) is not installed."""


class MetricsFileError(MazeEngineError, ValueError):
    """A run's ``metrics.jsonl`` that is missing, unreadable or empty (nothing to draw)."""


class JobServerError(MazeEngineError, ConnectionError):
    """``--submit``: the Ray job server at the address cannot be reached or talked to."""


class JobClientMissingError(MazeEngineError, ImportError):
    """``--submit``: the address's scheme needs a package that is not installed here."""


class HeadNodeMissingError(MazeEngineError, RuntimeError):
    """No Ray node declares the head node's custom resource, so consolidation cannot run."""


class EngineSyncError(MazeEngineError, ConnectionError):
    """The inference engines could not be reached to load a published adapter version."""


class AdapterRefusedError(MazeEngineError, RuntimeError):
    """An inference engine answered a published adapter version with a client error."""


class RolloutWorkerError(MazeEngineError, RuntimeError):
    """A Ray rollout worker of the local engine that did not start in time, or died mid-run.

    A worker dies with its Ray node; the run stops, and rerunning it with the same run
    directory resumes from its latest checkpoint.
    """
