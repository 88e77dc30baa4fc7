"""The root of every error maze-env raises, so callers can catch the package's errors at once."""


class MazeEnvError(Exception):
    """Base class of maze-env's errors."""


class EpisodeOverError(MazeEnvError, RuntimeError):
    """A turn played after the episode ended."""


class ExportError(MazeEnvError, RuntimeError):
    """A dataset export that cannot run, such as parquet without pyarrow installed."""


class RenderingError(MazeEnvError, ValueError):
    """A rendering record (``maze_rendering.json``, a dataset manifest) that cannot be read."""
