"""Deterministic visual 2D mazes, VisGym-compatible, usable with no RL stack."""

from maze_env.actions import (
    DIRECTION_DELTAS,
    MAX_ACTION_CHARS,
    Action,
    Direction,
    ParseFailure,
    ParseResult,
    parse_action,
)
from maze_env.env import MazeEnv
from maze_env.errors import EpisodeOverError, MazeEnvError
from maze_env.evalsets import EVAL_SETS, EvalSet, EvalSetError, get_eval_set, verify_eval_set
from maze_env.export import ENV_CLASS
from maze_env.game import MazeGame, StepResult
from maze_env.generators import GENERATORS
from maze_env.maze import (
    DEFAULT_SLACK,
    PRESETS,
    Maze,
    MazeSpec,
    MazeSpecError,
    generate,
    generate_from,
)
from maze_env.render import QWEN3_VL_TOKEN_PX, Renderer, Style, render_ascii, render_png, render_rgb

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_SLACK",
    "DIRECTION_DELTAS",
    "ENV_CLASS",
    "EVAL_SETS",
    "GENERATORS",
    "MAX_ACTION_CHARS",
    "PRESETS",
    "QWEN3_VL_TOKEN_PX",
    "Action",
    "Direction",
    "EpisodeOverError",
    "EvalSet",
    "EvalSetError",
    "Maze",
    "MazeEnv",
    "MazeEnvError",
    "MazeGame",
    "MazeSpec",
    "MazeSpecError",
    "ParseFailure",
    "ParseResult",
    "Renderer",
    "StepResult",
    "Style",
    "generate",
    "generate_from",
    "get_eval_set",
    "parse_action",
    "render_ascii",
    "render_png",
    "render_rgb",
    "verify_eval_set",
]
