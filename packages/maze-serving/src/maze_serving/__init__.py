"""Serve a Qwen-VL model + LoRA adapters over OpenAI-, vLLM- and SageMaker-compatible HTTP.

``create_app(EngineConfig(model_path=...))`` returns the FastAPI app; ``maze-serve`` (the
``maze-server`` app) is the command line around it.
"""

from maze_serving.app import DEFAULT_MAX_BODY_BYTES, create_app
from maze_serving.engine import LATEST_ALIAS, EngineConfig, ServingEngine
from maze_serving.errors import (
    BadRequestError,
    ModelNotFoundError,
    NotReadyError,
    OverloadedError,
    PayloadTooLargeError,
    RequestTimeoutError,
    ServingError,
)
from maze_serving.metrics import ServingMetrics
from maze_serving.server import free_port, run, serve_in_thread
from maze_serving.sources import SourceError, download_s3_prefix, resolve_location

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "LATEST_ALIAS",
    "BadRequestError",
    "EngineConfig",
    "ModelNotFoundError",
    "NotReadyError",
    "OverloadedError",
    "PayloadTooLargeError",
    "RequestTimeoutError",
    "ServingEngine",
    "ServingError",
    "ServingMetrics",
    "SourceError",
    "create_app",
    "download_s3_prefix",
    "free_port",
    "resolve_location",
    "run",
    "serve_in_thread",
]
