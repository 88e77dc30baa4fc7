"""Deterministic visual 2D mazes, VisGym-compatible, usable with no RL stack.

``MazeEnv`` (the Gymnasium env) is imported on first use: Gymnasium takes most of a second to
import, and verifiers, exporters and servers that only need mazes should not pay for it.
"""

from typing import TYPE_CHECKING, Any

from maze_env.actions import (
    DIRECTION_DELTAS,
    MAX_ACTION_CHARS,
    Action,
    Direction,
    ParseFailure,
    ParseResult,
    parse_action,
)
from maze_env.evalsets import EVAL_SETS, EvalSet, EvalSetError, get_eval_set, verify_eval_set
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

if TYPE_CHECKING:
    from maze_env.env import MazeEnv

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_SLACK",
    "DIRECTION_DELTAS",
    "EVAL_SETS",
    "GENERATORS",
    "MAX_ACTION_CHARS",
    "PRESETS",
    "QWEN3_VL_TOKEN_PX",
    "Action",
    "Direction",
    "EvalSet",
    "EvalSetError",
    "Maze",
    "MazeEnv",
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


def __getattr__(name: str) -> Any:
    if name == "MazeEnv":
        from maze_env.env import MazeEnv

        return MazeEnv
    raise AttributeError(f"module 'maze_env' has no attribute {name!r}")
