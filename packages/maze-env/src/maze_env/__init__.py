"""Deterministic visual 2D mazes, VisGym-compatible, usable with no RL stack."""

from maze_env.actions import (
    MAX_ACTION_CHARS,
    Action,
    Direction,
    ParseFailure,
    ParseResult,
    parse_action,
)
from maze_env.game import MazeGame, StepResult
from maze_env.generators import GENERATORS
from maze_env.maze import DEFAULT_SLACK, PRESETS, Maze, MazeSpec, MazeSpecError, generate

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_SLACK",
    "GENERATORS",
    "MAX_ACTION_CHARS",
    "PRESETS",
    "Action",
    "Direction",
    "Maze",
    "MazeGame",
    "MazeSpec",
    "MazeSpecError",
    "ParseFailure",
    "ParseResult",
    "StepResult",
    "generate",
    "parse_action",
]
