"""Bad input, limits, overload, timeouts and readiness: every case gets its status + OpenAI error."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest

from maze_serving.app import create_app
from maze_serving.engine import EngineConfig
from maze_serving.server import serve_in_thread

BASE = "tiny"
ServerFactory = Callable[..., AbstractContextManager[str]]


def post(url: str, body: Any, path: str = "/v1/chat/completions", **kw: Any) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=60, **kw)


def assert_error(r: httpx.Response, status: int, needle: str = "") -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and isinstance(err["type"], str)
    assert needle.lower() in err["message"].lower()


def user(content: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


def image_msg(url: str) -> list[dict[str, Any]]:
    return user([{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "hi"}])


def test_bad_requests_are_400(server: str, maze_messages: list[dict[str, Any]]) -> None:
    png = maze_messages[1]["content"][0]["image_url"]["url"]
    not_png = "data:image/png;base64," + base64.b64encode(b"not an image at all").decode()
    cases: list[tuple[Any, str]] = [
        ({"model": BASE, "messages": image_msg("data:image/png;base64,!!!")}, "base64"),
        ({"model": BASE, "messages": image_msg(not_png)}, "image"),
        ({"model": BASE, "messages": image_msg("http://example.com/x.png")}, "data URI"),
        ({"model": BASE, "messages": image_msg(png), "n": 2}, "n=1"),
        ({"model": BASE}, "messages"),
        ({"model": BASE, "messages": []}, "messages"),
        ({"model": BASE, "messages": [{"role": "assistant", "content": "x"}]}, "last message"),
        ({"model": BASE, "messages": [{"role": "tool", "content": "x"}]}, "role"),
        ({"model": BASE, "messages": user("hi"), "temperature": 5}, "temperature"),
        ({"model": BASE, "messages": user("hi"), "max_tokens": 100000}, "limit"),
        ({"model": BASE, "messages": user([{"type": "audio"}])}, "content"),
    ]
    for body, needle in cases:
        assert_error(post(server, body), 400, needle)
    r = httpx.post(
        f"{server}/v1/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert_error(r, 400)
    # Nothing was lost: the server still answers normally.
    assert (
        post(server, {"model": BASE, "messages": image_msg(png), "max_tokens": 2}).status_code
        == 200
    )


def test_unknown_model_route_and_method_are_404_405(server: str) -> None:
    assert_error(post(server, {"model": "nope", "messages": user("hi")}), 404, "nope")
    assert_error(post(server, {"model": f"{BASE}:ghost", "messages": user("hi")}), 404, "ghost")
    assert_error(httpx.get(f"{server}/v1/nowhere"), 404)
    assert_error(httpx.get(f"{server}/v1/chat/completions"), 405)


def test_body_and_image_limits_are_413(
    start_server: ServerFactory, maze_messages: list[dict[str, Any]]
) -> None:
    with start_server(max_body_bytes=200_000, max_image_pixels=64 * 64) as url:
        big = {"model": BASE, "messages": user("x" * 300_000)}
        assert_error(post(url, big), 413, "byte limit")

        def chunks() -> Iterator[bytes]:  # no Content-Length: the streamed bytes are counted
            yield b'{"model": "tiny", "messages": [{"role": "user", "content": "'
            for _ in range(30):
                yield b"y" * 10_000
            yield b'"}]}'

        r = httpx.post(
            f"{url}/v1/chat/completions",
            content=chunks(),
            headers={"content-type": "application/json"},
        )
        assert_error(r, 413, "byte limit")
        # The maze image (hundreds of pixels a side) is over this server's 64x64 budget.
        assert_error(post(url, {"model": BASE, "messages": maze_messages}), 413, "pixel")
    with start_server(max_image_bytes=100) as url:
        assert_error(post(url, {"model": BASE, "messages": maze_messages}), 413, "byte")
    with start_server(max_images=1) as url:
        two = [*maze_messages, *maze_messages[1:]]
        two = [two[0], {"role": "user", "content": two[1]["content"] + two[2]["content"]}]
        assert_error(post(url, {"model": BASE, "messages": two}), 413, "images")


def _long_stream(url: str, started: threading.Event, stop: threading.Event) -> None:
    body = {"model": BASE, "messages": user("go"), "max_tokens": 2000, "ignore_eos": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if '"content": "' in line and '"content": ""' not in line:
                started.set()
            if stop.is_set():
                return  # closing the stream cancels the generation


def test_overload_is_429_with_retry_after(start_server: ServerFactory) -> None:
    with start_server(max_pending=1) as url:
        started, stop = threading.Event(), threading.Event()
        t = threading.Thread(target=_long_stream, args=(url, started, stop))
        t.start()
        try:
            assert started.wait(30)
            r = post(url, {"model": BASE, "messages": user("hi"), "max_tokens": 2})
            assert_error(r, 429, "limit")
            assert int(r.headers["retry-after"]) >= 1
        finally:
            stop.set()
            t.join(30)
        # The cancelled stream frees its slot; the next request is served.
        deadline = time.monotonic() + 20
        while (
            r := post(url, {"model": BASE, "messages": user("hi"), "max_tokens": 2})
        ).status_code == 429:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert r.status_code == 200


def test_request_timeout_is_504_and_frees_the_worker(start_server: ServerFactory) -> None:
    with start_server(request_timeout_s=0.4) as url:
        t0 = time.monotonic()
        r = post(
            url, {"model": BASE, "messages": user("go"), "max_tokens": 2000, "ignore_eos": True}
        )
        assert_error(r, 504, "within 0.4 s")
        assert time.monotonic() - t0 < 5
        # The timed-out generation was stopped, so a short request fits in the budget.
        ok = post(url, {"model": BASE, "messages": user("hi"), "max_tokens": 2})
        assert ok.status_code == 200, ok.text


def test_ping_is_503_until_the_model_can_serve(start_server: ServerFactory) -> None:
    """SageMaker reads a 200 from /ping as "ready for traffic": loading answers 503 at once."""
    gate = threading.Event()
    with start_server(wait=False, engine_kwargs={"before_load": lambda: gate.wait(30)}) as url:
        t0 = time.monotonic()
        r = httpx.get(f"{url}/ping", timeout=2)
        assert time.monotonic() - t0 < 2
        assert r.status_code == 503 and r.json() == {"status": "loading"}
        assert r.headers["retry-after"] == "2"
        assert httpx.get(f"{url}/health").status_code == 503
        busy = post(url, {"model": BASE, "messages": user("hi")}, path="/invocations")
        assert_error(busy, 503, "loading")
        assert busy.headers["retry-after"] == "2"
        gate.set()
        deadline = time.monotonic() + 30
        while (r := httpx.get(f"{url}/ping")).status_code == 503:
            assert r.json() == {"status": "loading"}
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # The first 200 means what SageMaker takes it to mean: the next request is served.
        assert r.status_code == 200 and r.json() == {"status": "ready"}
        assert "retry-after" not in r.headers
        inv = post(url, {"messages": user("hi"), "max_tokens": 3}, path="/invocations")
        assert inv.status_code == 200 and inv.json()["model"] == BASE


def test_failed_load_is_reported_by_ping(tmp_path: Path) -> None:
    config = EngineConfig(model_path=str(tmp_path / "missing"))
    with serve_in_thread(create_app(config)) as url:
        deadline = time.monotonic() + 30
        while (r := httpx.get(f"{url}/ping")).json()["status"] == "loading":
            assert r.status_code == 503
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert r.status_code == 503 and "missing" in r.json()["error"]
        assert r.json()["status"] == "failed" and "retry-after" not in r.headers
        assert_error(post(url, {"messages": user("hi")}, path="/invocations"), 503, "failed")


@pytest.mark.parametrize("path", ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"])
def test_lora_routes_validate_names(server: str, path: str) -> None:
    assert_error(post(server, {"lora_name": ""}, path=path), 400)
    if path.endswith("/load_lora_adapter"):
        for bad in ("a:b", "latest", "v3"):
            assert_error(
                post(server, {"lora_name": bad, "lora_path": "/x"}, path=path), 400, "invalid"
            )
