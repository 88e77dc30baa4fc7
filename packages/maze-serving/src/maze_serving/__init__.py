"""Serve a Qwen-VL model + LoRA adapters over OpenAI-, vLLM- and SageMaker-compatible HTTP.

``create_app(EngineConfig(model_path=...))`` returns the FastAPI app; ``maze-serve`` (the
``maze-server`` app) is the command line around it.

Names below are imported on first use, so ``maze_serving.early`` (the standard-library
``/ping`` responder that runs while torch imports) can load without pulling in torch.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from maze_serving.app import DEFAULT_MAX_BODY_BYTES, create_app
    from maze_serving.early import EarlyResponder, bind_socket
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

_EXPORTS = {
    "app": ("DEFAULT_MAX_BODY_BYTES", "create_app"),
    "early": ("EarlyResponder", "bind_socket"),
    "engine": ("LATEST_ALIAS", "EngineConfig", "ServingEngine"),
    "errors": (
        "BadRequestError",
        "ModelNotFoundError",
        "NotReadyError",
        "OverloadedError",
        "PayloadTooLargeError",
        "RequestTimeoutError",
        "ServingError",
    ),
    "metrics": ("ServingMetrics",),
    "server": ("free_port", "run", "serve_in_thread"),
    "sources": ("SourceError", "download_s3_prefix", "resolve_location"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "LATEST_ALIAS",
    "BadRequestError",
    "EarlyResponder",
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
    "bind_socket",
    "create_app",
    "download_s3_prefix",
    "free_port",
    "resolve_location",
    "run",
    "serve_in_thread",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'maze_serving' has no attribute {name!r}")
    return getattr(import_module(f"maze_serving.{module}"), name)
