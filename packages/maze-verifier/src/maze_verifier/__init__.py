"""Reward verifier for visual maze episodes, and the skyrl-gym environment RL trainers run.

The environment, :class:`maze_verifier.env.MazeTextEnv`, is imported by module path: it imports
skyrl-gym, which is slow to import. :func:`register_env` imports it only when called.
"""

from importlib.metadata import version as _version

from maze_verifier.batch import (
    INVALID,
    STOP,
    BatchError,
    BatchResult,
    MazeBatch,
    action_code,
    encode_turns,
    verify_batch,
    verify_texts,
)
from maze_verifier.errors import EpisodeOverError, MazeTextEnvConfigError, MazeVerifierError
from maze_verifier.path import (
    MAX_PATH_CHARS,
    MAX_PATH_MOVES,
    PathAnswer,
    PathFailure,
    PathResult,
    parse_path,
)
from maze_verifier.registration import register_env
from maze_verifier.score import EpisodeScore, efficiency_credit, score_episode, score_path
from maze_verifier.specs import (
    EFFICIENCY,
    SPECS,
    TASK,
    VISGYM_SFT,
    RewardSpec,
    RewardSpecError,
    get_spec,
    register_spec,
)
from maze_verifier.tags import SFT_TAGS, has_all_tags, has_nonempty_tag, tag_contents, tag_fraction

__version__ = _version("maze-verifier")  # one source: the pyproject's version

__all__ = [
    "EFFICIENCY",
    "INVALID",
    "MAX_PATH_CHARS",
    "MAX_PATH_MOVES",
    "SFT_TAGS",
    "SPECS",
    "STOP",
    "TASK",
    "VISGYM_SFT",
    "BatchError",
    "BatchResult",
    "EpisodeOverError",
    "EpisodeScore",
    "MazeBatch",
    "MazeTextEnvConfigError",
    "MazeVerifierError",
    "PathAnswer",
    "PathFailure",
    "PathResult",
    "RewardSpec",
    "RewardSpecError",
    "action_code",
    "efficiency_credit",
    "encode_turns",
    "get_spec",
    "has_all_tags",
    "has_nonempty_tag",
    "parse_path",
    "register_env",
    "register_spec",
    "score_episode",
    "score_path",
    "tag_contents",
    "tag_fraction",
    "verify_batch",
    "verify_texts",
]
