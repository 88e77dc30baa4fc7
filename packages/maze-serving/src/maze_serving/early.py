"""Answer ``/ping`` from the first second of a container's life, before torch is imported.

SageMaker probes ``/ping`` as soon as the container starts, but importing torch and
transformers takes 10-35 s on a cold container. The CLI therefore binds its listening socket
first, serves it from this standard-library responder while the heavy imports run, then hands
the *same* socket to uvicorn: no connection is refused in between, and connections that queue
during the handover are answered by the real app. Every answer is a 503 with ``Retry-After``
(``/ping``: ``{"status": "starting"}``): SageMaker takes a 200 as "ready for traffic", which
only the app says, once the model is loaded. Standard library only, so importing this module
costs milliseconds.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

log = logging.getLogger(__name__)

STARTING = "starting"
RETRY_AFTER_S = 5


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv6 when ``host`` has a colon)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on sockets whose proto says TCP,
    # and without it every keep-alive response waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: one request per connection, so no client keeps talking to the responder after
    # uvicorn has taken over the socket.
    protocol_version = "HTTP/1.0"

    def _reply(self, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Retry-After", str(RETRY_AFTER_S))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _handle(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/ping", "/health"):
            # Same body as the app's /ping while loading; a 503, because SageMaker reads a 200
            # as "ready for traffic" and nothing can be served yet.
            self._reply({"status": STARTING})
        else:
            self._reply(
                {
                    "error": {
                        "message": "the server is starting; retry shortly",
                        "type": "ServiceUnavailable",
                        "code": 503,
                    }
                }
            )

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _handle  # noqa: N815

    def log_message(self, format: str, *args: object) -> None:
        log.debug("early responder: " + format, *args)


class EarlyResponder:
    """Serve ``sock`` with a ``/ping`` responder until :meth:`stop` (or the ``with`` block ends).

    The socket stays open afterwards, for the real server.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._server = ThreadingHTTPServer(
            sock.getsockname()[:2], _Handler, bind_and_activate=False
        )
        self._server.socket.close()  # the unbound socket the constructor made
        self._server.socket = sock
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    def start(self) -> EarlyResponder:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="early-ping",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()  # not server_close(): that would close the shared socket
            self._thread.join()
            self._thread = None

    def __enter__(self) -> EarlyResponder:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
