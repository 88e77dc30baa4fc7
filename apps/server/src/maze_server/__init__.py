"""``maze-serve``: the command line that starts the ``maze_serving`` app."""

from importlib.metadata import version as _version

__version__ = _version("maze-server")  # one source: the pyproject's version
