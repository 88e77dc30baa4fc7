"""The pre-torch socket and responder of ``maze-serve``: 503 while starting, TCP_NODELAY."""

from __future__ import annotations

import asyncio
import socket

import httpx

from maze_serving.early import EarlyResponder, bind_socket


def test_early_responder_answers_503_with_retry_after() -> None:
    sock = bind_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        with EarlyResponder(sock):
            for path in ("/ping", "/health"):
                r = httpx.get(f"{url}{path}", timeout=5)
                assert r.status_code == 503 and r.json() == {"status": "starting"}
                assert r.headers["retry-after"] == "5"
            r = httpx.post(f"{url}/invocations", json={"messages": []}, timeout=5)
            assert r.status_code == 503 and r.json()["error"]["code"] == 503
            assert r.headers["retry-after"] == "5"
    finally:
        sock.close()


def test_connections_on_the_bound_socket_get_tcp_nodelay() -> None:
    """asyncio (so uvicorn) sets TCP_NODELAY only on sockets whose proto is TCP; without it a
    keep-alive client waits ~40 ms per request for a delayed ACK."""
    sock = bind_socket("127.0.0.1", 0)

    async def accepted_nodelay() -> int:
        loop = asyncio.get_running_loop()
        seen: asyncio.Future[int] = loop.create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                conn: socket.socket = transport.get_extra_info("socket")
                seen.set_result(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await loop.create_server(Probe, sock=sock)
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        try:
            return await asyncio.wait_for(seen, 10)
        finally:
            writer.close()
            server.close()

    try:
        assert asyncio.run(accepted_nodelay()) != 0
    finally:
        sock.close()
