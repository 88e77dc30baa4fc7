"""Small model artifacts shipped with maze-engine, each with its recipe and a verified manifest.

An artifact is a directory beside this file: a loadable model (``maze_policy.model.load_vlm``),
``recipe.json`` (the command and settings that produced it, and what it measured) and a
weight-sync ``manifest.json`` (size and sha256 of every file), checked on every load.
"""

from __future__ import annotations

from pathlib import Path

from maze_engine.errors import MazeEngineError

ARTIFACTS_DIR = Path(__file__).parent


class ArtifactError(MazeEngineError):
    """A shipped artifact that is unknown, or whose files do not match its manifest."""


def shipped_artifacts() -> list[str]:
    """Names of the artifacts shipped with the package."""
    return sorted(p.name for p in ARTIFACTS_DIR.iterdir() if (p / "manifest.json").is_file())


def artifact_path(name: str) -> Path:
    """The directory of shipped artifact ``name``, verified against its manifest.

    Raises:
        ArtifactError: the name is unknown or a file is missing or changed.
    """
    from weight_sync import WeightSyncError, fs

    path = ARTIFACTS_DIR / name
    if name not in shipped_artifacts():
        raise ArtifactError(
            f"no shipped artifact {name!r}; shipped: {', '.join(shipped_artifacts()) or 'none'}"
        )
    try:
        fs.verify_manifest(path)
    except WeightSyncError as exc:
        raise ArtifactError(f"artifact {name!r} does not match its manifest: {exc}") from exc
    return path


def model_dir(name: str) -> Path:
    """A model directory as given, or else shipped artifact ``name`` (see :func:`artifact_path`)."""
    if Path(name).is_dir():
        return Path(name)
    return artifact_path(name)
