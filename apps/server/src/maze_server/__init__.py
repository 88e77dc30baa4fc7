"""``maze-serve``: the command line that starts the ``maze_serving`` app."""

__version__ = "0.1.0"
