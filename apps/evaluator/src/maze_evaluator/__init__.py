"""maze-eval: a thin CLI over maze_evaluation."""

from importlib.metadata import version as _version

from maze_evaluator.cli import build_parser, main

__version__ = _version("maze-evaluator")  # one source: the pyproject's version

__all__ = ["build_parser", "main"]
