"""Reward verifier for visual maze episodes, and the skyrl-gym environment RL trainers run.

The environment lives in :mod:`maze_verifier.env` (it imports skyrl-gym, which is slow to
import); :func:`register_env` imports it on demand.
"""

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
from maze_verifier.path import (
    MAX_PATH_CHARS,
    MAX_PATH_MOVES,
    PathAnswer,
    PathFailure,
    PathResult,
    parse_path,
)
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

__version__ = "0.1.0"


def register_env(env_class: str = "maze") -> str:
    """Register the maze environment with skyrl-gym (idempotent); see :mod:`maze_verifier.env`."""
    from maze_verifier.env import register_env as _register

    return _register(env_class)


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
    "EpisodeScore",
    "MazeBatch",
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
