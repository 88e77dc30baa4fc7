"""Deterministic visual 2D mazes, VisGym-compatible, usable with no RL stack."""

from importlib.metadata import version as _version

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
from maze_env.errors import EpisodeOverError, MazeEnvError, RenderingError
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
from maze_env.render import (
    QWEN3_VL_TOKEN_PX,
    RENDERING_FILE,
    Renderer,
    Style,
    read_rendering,
    render_ascii,
    render_png,
    render_rgb,
    write_rendering,
)

__version__ = _version("maze-env")  # one source: the pyproject's version

__all__ = [
    "DEFAULT_SLACK",
    "DIRECTION_DELTAS",
    "ENV_CLASS",
    "EVAL_SETS",
    "GENERATORS",
    "MAX_ACTION_CHARS",
    "PRESETS",
    "QWEN3_VL_TOKEN_PX",
    "RENDERING_FILE",
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
    "RenderingError",
    "StepResult",
    "Style",
    "generate",
    "generate_from",
    "get_eval_set",
    "parse_action",
    "read_rendering",
    "render_ascii",
    "render_png",
    "render_rgb",
    "verify_eval_set",
    "write_rendering",
]
