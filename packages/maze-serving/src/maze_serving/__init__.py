"""Serve a Qwen-VL model + LoRA adapters over OpenAI-, vLLM- and SageMaker-compatible HTTP.

The package exports only its errors, so ``maze_serving.early`` (the standard-library ``/ping``
responder that runs while torch imports) loads in milliseconds. Import the rest by module path:
``maze_serving.app.create_app``, ``maze_serving.engine.EngineConfig`` / ``ServingEngine``,
``maze_serving.server.serve_in_thread`` / ``run`` / ``free_port``, ``maze_serving.early``,
``maze_serving.sources``. ``maze-serve`` (the ``maze-server`` app) is the command line around
it.
"""

from importlib.metadata import version as _version

from maze_serving.errors import (
    BadRequestError,
    ModelNotFoundError,
    NotReadyError,
    OverloadedError,
    PayloadTooLargeError,
    RequestTimeoutError,
    ServingError,
    SourceError,
    StartupError,
)

__version__ = _version("maze-serving")  # one source: the pyproject's version

__all__ = [
    "BadRequestError",
    "ModelNotFoundError",
    "NotReadyError",
    "OverloadedError",
    "PayloadTooLargeError",
    "RequestTimeoutError",
    "ServingError",
    "SourceError",
    "StartupError",
    "__version__",
]
