"""``maze-train``: a thin command over maze-engine's local trainer and SkyRL cluster launcher."""

from importlib.metadata import version as _version

__version__ = _version("maze-trainer")  # one source: the pyproject's version
