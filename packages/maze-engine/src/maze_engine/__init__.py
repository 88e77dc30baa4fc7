"""GRPO + LoRA training for VLMs on visual mazes: the local engine and the SkyRL cluster path.

Modules: ``config`` (one typed config for both engines), ``data`` (the dataset exporter and
prompt batches), ``sft`` (oracle warm start), ``grpo`` (SkyRL's losses), ``checkpoint``
(SkyRL layout, exact resume), ``trainer`` (the local loop, Ray workers), ``cluster`` (SkyRL's
own trainer on a GPU Ray cluster), ``submit`` (Ray job submission) and ``plots`` (training
curves). The policy itself (model loading, chat encoding, sampling, rollouts) is the
``maze-policy`` package.

Only torch-free names are exported here; import the rest by module path.
"""

from importlib.metadata import version as _version

from maze_engine.errors import (
    AdapterLoadError,
    CheckpointError,
    ConfigError,
    DatasetError,
    GpuImageRequiredError,
    JobClientMissingError,
    JobServerError,
    MazeEngineError,
    MetricsFileError,
)

__version__ = _version("maze-engine")  # one source: the pyproject's version

__all__ = [
    "AdapterLoadError",
    "CheckpointError",
    "ConfigError",
    "DatasetError",
    "GpuImageRequiredError",
    "JobClientMissingError",
    "JobServerError",
    "MazeEngineError",
    "MetricsFileError",
    "__version__",
]
