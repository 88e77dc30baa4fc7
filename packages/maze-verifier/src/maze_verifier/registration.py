"""Registration of :class:`maze_verifier.env.MazeTextEnv` with skyrl-gym.

Kept apart from :mod:`maze_verifier.env` so that ``import maze_verifier`` does not import
skyrl-gym (about two seconds); only calling :func:`register_env` does.
"""

from __future__ import annotations

from maze_env.export import ENV_CLASS
from maze_verifier.errors import MazeTextEnvConfigError

ENTRY_POINT = "maze_verifier.env:MazeTextEnv"


def register_env(env_class: str = ENV_CLASS) -> str:
    """Register :class:`~maze_verifier.env.MazeTextEnv` with skyrl-gym as ``env_class``.

    Safe to call repeatedly.

    The entry point is an import string, so Ray workers that only received the registry entry
    import the env module themselves. Raises if ``env_class`` is taken by another environment.
    """
    from skyrl_gym.envs.registration import register, registry

    from maze_verifier.env import MazeTextEnv

    existing = registry.get(env_class)
    if existing is not None:
        if existing.entry_point in (ENTRY_POINT, MazeTextEnv):
            return env_class
        raise MazeTextEnvConfigError(
            f"skyrl-gym env_class {env_class!r} is already registered to {existing.entry_point!r}"
        )
    register(id=env_class, entry_point=ENTRY_POINT)
    return env_class
