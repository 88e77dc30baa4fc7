"""Run an app under uvicorn: blocking (the CLI) or on a background thread (tests, benchmarks)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Generator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from maze_serving.errors import StartupError


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago.

    Args:
        host: The address to probe.

    Returns:
        The port number the OS picked.
    """
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
    """Serve ``app`` until interrupted (SIGINT/SIGTERM).

    Args:
        app: The ASGI app (from :func:`maze_serving.app.create_app`).
        host: Bind address, when ``sock`` is not given.
        port: Bind port, when ``sock`` is not given.
        log_level: uvicorn's log level.
        sock: An already listening socket to serve instead of binding ``host:port``.
    """
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
    """Start ``app`` on a real socket in a daemon thread; stop it when the block ends.

    Args:
        app: The ASGI app (from :func:`maze_serving.app.create_app`).
        host: Bind address.
        port: Bind port (default: a free one).
        startup_timeout: Seconds to wait for uvicorn (and, with ``wait_model``, the model).
        wait_model: Also wait until the model has loaded or failed.

    Yields:
        The server's base URL, ``http://host:port``.

    Raises:
        StartupError: uvicorn did not start, or the model did not load, within
            ``startup_timeout``.
    """
    port = port or free_port(host)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise StartupError(f"uvicorn did not start on {host}:{port}")
        time.sleep(0.02)
    engine = getattr(app.state, "engine", None)
    if wait_model and engine is not None and not engine.wait_ready(startup_timeout):
        server.should_exit = True
        raise StartupError(f"model did not load within {startup_timeout} s")
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
