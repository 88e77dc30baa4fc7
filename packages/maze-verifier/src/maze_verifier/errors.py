"""The root of every error maze-verifier raises, and the errors shared by its modules."""


class MazeVerifierError(Exception):
    """Base class of maze-verifier's errors."""


class MazeTextEnvConfigError(MazeVerifierError, ValueError):
    """An ``env_config`` or dataset row (``extras``) the environment cannot use."""


class EpisodeOverError(MazeVerifierError, RuntimeError):
    """A step after the episode ended."""
