"""Run an app under uvicorn: blocking (the CLI) or on a background thread (tests, benchmarks)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Generator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def run(
    app: FastAPI,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    *,
    sock: socket.socket | None = None,
) -> None:
    """Serve until interrupted (SIGINT/SIGTERM), on ``sock`` when given (already listening)."""
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=30
    )
    uvicorn.Server(config).run(sockets=[sock] if sock is not None else None)


@contextmanager
def serve_in_thread(
    app: FastAPI,
    host: str = "127.0.0.1",
    port: int | None = None,
    startup_timeout: float = 30.0,
    *,
    wait_model: bool = False,
) -> Generator[str]:
    """Start ``app`` on a real socket in a daemon thread; yields its base URL, stops on exit.

    ``wait_model`` also waits (up to ``startup_timeout``) until the model has loaded or failed.
    """
    port = port or free_port(host)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn did not start on {host}:{port}")
        time.sleep(0.02)
    engine = getattr(app.state, "engine", None)
    if wait_model and engine is not None and not engine.wait_ready(startup_timeout):
        server.should_exit = True
        raise RuntimeError(f"model did not load within {startup_timeout} s")
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
