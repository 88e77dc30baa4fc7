"""Serve a Qwen-VL model + LoRA adapters over OpenAI-, vLLM- and SageMaker-compatible HTTP.

The package exports only its errors, so ``maze_serving.early`` (the standard-library ``/ping``
responder that runs while torch imports) loads in milliseconds. Import the rest by module path:
``maze_serving.app.create_app``, ``maze_serving.engine.EngineConfig`` / ``ServingEngine``,
``maze_serving.server.serve_in_thread`` / ``run`` / ``free_port``, ``maze_serving.early``,
``maze_serving.sources``, ``maze_serving.deploy``. ``maze-serve`` (the ``maze-server`` app) is
the command line around it.
"""

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

__version__ = "0.1.0"

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
