"""``maze-serve``: argument parsing and startup only; the server lives in ``maze_serving``.

    maze-serve --model DIR [--served-model-name NAME] [--lora-modules name=path ...]
               [--watch STORE_ROOT] [--host 127.0.0.1] [--port 8000]
    maze-serve serve        # SageMaker: the image is started as ``<image> serve``

``serve`` reads the SageMaker conventions: the model from ``SM_MODEL_DIR`` (default
``/opt/ml/model``) unless ``MAZE_MODEL`` names a directory or ``s3://`` prefix; an adapter from
``MAZE_ADAPTER`` (directory or ``s3://`` prefix), served as the default for ``/invocations``;
or, when the model directory itself is a LoRA adapter (``adapter_config.json``), the base from
``MAZE_BASE_MODEL``. It binds 0.0.0.0:8080 unless ``--host``/``--port`` say otherwise.
The port is bound before torch is imported and answers ``/ping`` from then on: 503 +
``Retry-After`` (a standard-library responder until the app takes over the same socket, then
the app while the model loads), 200 once a request can be served. Downloads and model loading
run in the background.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

SAGEMAKER_MODEL_DIR = "/opt/ml/model"


def build_parser() -> argparse.ArgumentParser:
    """The ``maze-serve`` parser: model, adapters, limits and bind address."""
    p = argparse.ArgumentParser(
        prog="maze-serve",
        description="Serve a Qwen-VL model + LoRA adapters (OpenAI, vLLM LoRA and SageMaker routes).",
    )
    p.add_argument("command", nargs="?", choices=["serve"], help="'serve': SageMaker mode")
    p.add_argument("--model", help="model directory or s3:// prefix (required outside 'serve')")
    p.add_argument("--served-model-name", help="base model id (default: the directory name)")
    p.add_argument(
        "--lora-modules",
        nargs="*",
        default=[],
        metavar="NAME=PATH",
        help="adapters to load at startup (directory or s3:// prefix)",
    )
    p.add_argument("--default-adapter", help="adapter used when a request names no model")
    p.add_argument(
        "--watch", help="weight-sync store root: serve each new version as <base>:latest"
    )
    p.add_argument("--host", help="bind address (default 127.0.0.1; 0.0.0.0 for 'serve')")
    p.add_argument("--port", type=int, help="port (default 8000; 8080 for 'serve')")
    p.add_argument("--max-pending", type=int, default=8, help="concurrent requests before 429")
    p.add_argument("--request-timeout", type=float, default=60.0, help="seconds before 504")
    p.add_argument(
        "--max-tokens-limit",
        type=int,
        default=2048,
        help="largest max_tokens a request may ask for; more is a 400 (default %(default)s)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=32 * 1024 * 1024,
        help="largest request body, images included; more is a 413 (default 32 MiB)",
    )
    p.add_argument("--threads", type=int, help="torch intra-op threads")
    p.add_argument(
        "--batch-max-size",
        type=int,
        default=8,
        help="most concurrent requests generated together in one batch (default %(default)s)",
    )
    p.add_argument(
        "--batch-wait-ms",
        type=float,
        default=100.0,
        help="under concurrent load, how long a batch waits for more requests to join; "
        "a request arriving alone never waits (default %(default)s)",
    )
    p.add_argument(
        "--no-batching",
        action="store_true",
        help="generate one request at a time (the same as --batch-max-size 1)",
    )
    p.add_argument(
        "--context",
        help="what each request is answered from, as the served policy was trained (maze-train's "
        "local.context): full (the conversation as sent), latest (its system prompt "
        "and the turn after the last reply), recent (and that reply), route (the last user "
        "turn's frame, asked the route question) or route-recent (that, after the last reply); "
        "env MAZE_CONTEXT; default: as the --lora-modules adapters record it, else full",
    )
    p.add_argument(
        "--cache-dir", help="where s3:// downloads go (default: a temp dir, removed on shutdown)"
    )
    p.add_argument(
        "--log-level",
        default="info",
        help="debug, info, warning or error (default %(default)s)",
    )
    return p


def _lora_modules(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--lora-modules wants NAME=PATH, got {item!r}")
        out[name] = path
    return out


class UsageError(Exception):
    """Arguments or environment that cannot start a server."""


def _context(explicit: str | None, adapters: Mapping[str, str]) -> str:
    """The context to answer in, from the local adapters' records (``choose_context``).

    An adapter whose record an explicit choice overrides is named on stderr.
    """
    from maze_policy.contexts import choose_context, read_context
    from maze_policy.errors import ContextRecordError

    recorded: dict[str, str] = {}
    for name, path in adapters.items():
        if path.startswith("s3://"):  # read when the engine loads it
            continue
        try:
            found = read_context(path)
        except ContextRecordError as exc:
            raise UsageError(f"--lora-modules {name}: {exc}") from None
        if found is not None:
            recorded[name] = found
    try:
        choice = choose_context(explicit, recorded)
    except ValueError as exc:
        if explicit is not None:
            raise UsageError(f"--context: {exc}") from None
        raise UsageError(
            f"{exc}; a server answers in one: serve them apart or choose with --context"
        ) from None
    for name, found in choice.differing.items():
        print(
            f"warning: adapter {name} was trained in context {found!r}; answering in "
            f"{choice.context!r} (--context) is not the trained policy",
            file=sys.stderr,
        )
    return choice.context


@dataclass(frozen=True)
class Settings:
    """What the arguments and environment resolve to; cheap to compute (no torch)."""

    model_path: str
    served_model_name: str
    adapters: dict[str, str]
    default_adapter: str | None
    watch_dir: str | None
    context: str
    cache_dir: str | None
    host: str
    port: int
    args: argparse.Namespace


@dataclass(frozen=True)
class Launch:
    """A built app and where to serve it; :func:`main` binds ``host:port`` and runs it."""

    app: FastAPI
    host: str
    port: int
    log_level: str


def resolve(argv: Sequence[str] | None = None) -> Settings:
    """Parse ``argv`` (+ SageMaker env for ``serve``); raises :class:`UsageError`."""
    args = build_parser().parse_args(argv)
    sagemaker = args.command == "serve"
    env = os.environ
    # None: the engine makes a temp dir at its first download and removes it when it stops.
    cache = args.cache_dir or env.get("MAZE_CACHE_DIR")
    adapters = _lora_modules(args.lora_modules)
    default_adapter: str | None = args.default_adapter
    model: str | None = args.model
    if sagemaker:
        model = model or env.get("MAZE_MODEL") or env.get("SM_MODEL_DIR", SAGEMAKER_MODEL_DIR)
        if env.get("MAZE_ADAPTER"):
            adapters.setdefault("adapter", env["MAZE_ADAPTER"])
            default_adapter = default_adapter or "adapter"
    if model is None:
        raise UsageError("--model is required (or use 'maze-serve serve')")
    model_path = model
    if not model.startswith("s3://") and (Path(model) / "adapter_config.json").is_file():
        # SageMaker packaged just the adapter: the base comes from MAZE_BASE_MODEL.
        base = env.get("MAZE_BASE_MODEL")
        if not base:
            raise UsageError(f"{model} is a LoRA adapter; set MAZE_BASE_MODEL to its base model")
        adapters.setdefault("adapter", model)
        default_adapter = default_adapter or "adapter"
        model_path = base
    if args.batch_max_size < 1 or args.batch_wait_ms < 0:
        raise UsageError("--batch-max-size must be >= 1 and --batch-wait-ms >= 0")
    name = args.served_model_name or env.get("MAZE_SERVED_MODEL_NAME")
    context = _context(args.context or env.get("MAZE_CONTEXT"), adapters)
    return Settings(
        model_path=model_path,
        served_model_name=name or Path(model_path.rstrip("/")).name,
        adapters=adapters,
        default_adapter=default_adapter,
        watch_dir=args.watch or env.get("MAZE_WATCH_DIR"),
        context=context,
        cache_dir=cache,
        host=args.host or ("0.0.0.0" if sagemaker else "127.0.0.1"),
        port=args.port or (8080 if sagemaker else 8000),
        args=args,
    )


def create(settings: Settings) -> Launch:
    """Build the app; the heavy imports (torch, transformers, FastAPI) happen here.

    Args:
        settings: What :func:`resolve` made of the arguments and environment.

    Returns:
        The app (model not loaded yet) and where to bind it.
    """
    from maze_serving.app import create_app
    from maze_serving.engine import EngineConfig

    args = settings.args
    config = EngineConfig(
        model_path=settings.model_path,
        served_model_name=settings.served_model_name,
        adapters=settings.adapters,
        default_adapter=settings.default_adapter,
        watch_dir=settings.watch_dir,
        max_pending=args.max_pending,
        request_timeout_s=args.request_timeout,
        max_new_tokens_limit=args.max_tokens_limit,
        threads=args.threads,
        batch_max_size=1 if args.no_batching else args.batch_max_size,
        batch_wait_ms=args.batch_wait_ms,
        context=settings.context,
        cache_dir=settings.cache_dir,
    )
    app = create_app(config, max_body_bytes=args.max_body_bytes, cache_dir=settings.cache_dir)
    return Launch(app, settings.host, settings.port, args.log_level)


def build(argv: Sequence[str] | None = None) -> Launch:
    """:func:`resolve` then :func:`create`: the app and where to bind it."""
    return create(resolve(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``maze-serve``: bind the port, answer ``/ping`` early, then serve the app.

    Args:
        argv: Command-line arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit code: 0 after a clean shutdown, 2 for bad arguments or a port in use.
    """
    try:
        settings = resolve(argv)
    except UsageError as exc:
        print(f"maze-serve: {exc}", file=sys.stderr)
        return 2
    from maze_serving.early import EarlyResponder, bind_socket

    logging.basicConfig(
        level=settings.args.log_level.upper(), format="%(asctime)s %(name)s %(message)s"
    )
    try:
        sock = bind_socket(settings.host, settings.port)
    except OSError as exc:
        print(
            f"maze-serve: cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr
        )
        return 2
    with EarlyResponder(sock):
        launch = create(settings)
    from maze_serving.server import run

    run(launch.app, host=launch.host, port=launch.port, log_level=launch.log_level, sock=sock)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
