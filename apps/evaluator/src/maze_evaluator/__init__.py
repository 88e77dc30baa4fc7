"""maze-eval: a thin CLI over maze_evaluation."""

from maze_evaluator.cli import build_parser, main

__version__ = "0.1.0"

__all__ = ["build_parser", "main"]
