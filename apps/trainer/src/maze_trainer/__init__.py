"""``maze-train``: a thin command over maze-engine's local trainer and SkyRL cluster launcher."""

__version__ = "0.1.0"
