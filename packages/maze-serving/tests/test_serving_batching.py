"""Dynamic batching: a request batched with others gets what it gets alone; errors stay its own."""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

BASE = "tiny"
ServerFactory = Callable[..., AbstractContextManager[str]]


def user(content: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


def png_uri(img: Image.Image) -> str:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def call(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """One chat request: status plus what it generated (stream chunks joined)."""
    if not body.get("stream"):
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        out: dict[str, Any] = {"status": r.status_code}
        if r.status_code != 200:
            return {**out, "error": r.json()["error"]["message"]}
        choice = r.json()["choices"][0]
        out.update(text=choice["message"]["content"], finish=choice["finish_reason"])
        if choice["logprobs"] is not None:
            content = choice["logprobs"]["content"]
            out.update(ids=[t["token_id"] for t in content], lps=[t["logprob"] for t in content])
        return out
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
        events = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
        assert r.status_code == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
    text = "".join(c["delta"].get("content", "") for c in chunks)
    return {"status": 200, "text": text, "finish": chunks[-1]["finish_reason"]}


def metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def test_batched_requests_get_their_solo_results_and_errors_stay_their_own(
    start_server: ServerFactory, adapters: list[Path], maze_messages: list[dict[str, Any]]
) -> None:
    png = maze_messages[1]["content"][0]["image_url"]["url"]
    raw = base64.b64decode(png.split(",", 1)[1])
    # A readable PNG header (so admission's size check passes) over truncated pixel data.
    truncated = "data:image/png;base64," + base64.b64encode(raw[:80]).decode()
    other_maze = [*maze_messages[:1], {**maze_messages[1]}]
    other_maze[1]["content"] = [*maze_messages[1]["content"][:-1], {"type": "text", "text": "Go"}]
    lp: dict[str, Any] = {"logprobs": True}
    good: list[dict[str, Any]] = [
        {"messages": maze_messages, "max_tokens": 8, "temperature": 0, **lp},
        {"messages": maze_messages, "max_tokens": 10, "temperature": 1.0, "top_p": 0.9, "seed": 7}
        | lp,
        {"messages": user("hi"), "max_tokens": 12, "temperature": 0.7, "seed": 3, "min_tokens": 4}
        | lp,
        {"messages": user("a longer text prompt " * 5), "max_tokens": 6, "temperature": 0}
        | {"ignore_eos": True, **lp},
        {"messages": other_maze, "max_tokens": 9, "temperature": 1.3, "top_p": 0.5, "seed": 11}
        | lp,
        {"messages": user("stream me"), "max_tokens": 8, "temperature": 1.0, "seed": 5}
        | {"stream": True},
        {"model": f"{BASE}:a1", "messages": maze_messages, "max_tokens": 6, "seed": 2} | lp,
        {"messages": user("short"), "max_tokens": 3, "temperature": 0},
        {"messages": user("long"), "max_tokens": 120, "temperature": 0, "ignore_eos": True},
    ]
    short, long = len(good) - 2, len(good) - 1
    bad: list[tuple[dict[str, Any], str]] = [
        (
            {
                "messages": user([{"type": "image_url", "image_url": {"url": truncated}}]),
                "max_tokens": 4,
            },
            "cannot decode",
        ),
        (
            {
                "messages": user(
                    [
                        {
                            "type": "image_url",
                            "image_url": {"url": png_uri(Image.new("RGB", (3000, 2)))},
                        }
                    ]
                ),
                "max_tokens": 4,
            },
            "aspect ratio",
        ),
        ({"messages": maze_messages, "max_tokens": 2100}, "context"),
    ]
    bodies = [{"model": BASE, **b} for b in good] + [{"model": BASE, **b} for b, _ in bad]
    with start_server(
        adapters={"a1": str(adapters[0])},
        max_pending=32,
        batch_max_size=16,
        max_model_len=2300,  # the blocker's 2000 tokens fit; the maze prompt + 2100 do not
        max_new_tokens_limit=4096,
    ) as url:
        solo = [call(url, b) for b in bodies]

        # While a long stream holds the worker, every request queues; closing the stream
        # releases the worker, whose next turn takes them all as one batch per adapter.
        started, stop = threading.Event(), threading.Event()

        def blocker() -> None:
            body = {"model": BASE, "messages": user("go"), "max_tokens": 2000, "ignore_eos": True}
            with httpx.stream(
                "POST", f"{url}/v1/chat/completions", json=body | {"stream": True}
            ) as r:
                for line in r.iter_lines():
                    if '"content": "' in line and '"content": ""' not in line:
                        started.set()
                    if stop.is_set():
                        return

        hold = threading.Thread(target=blocker)
        hold.start()
        try:
            assert started.wait(30)
            with ThreadPoolExecutor(len(bodies)) as pool:
                futures = [pool.submit(call, url, b) for b in bodies]
                deadline = time.monotonic() + 30
                while metric(url, "maze_serving_num_requests_running") < 1 + len(bodies):
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
                stop.set()
                order = [futures.index(f) for f in as_completed(futures)]
                batched = [f.result() for f in futures]
        finally:
            stop.set()
            hold.join(30)
        text = httpx.get(f"{url}/metrics").text

    for i, (alone, together) in enumerate(zip(solo, batched, strict=True)):
        assert alone["status"] == together["status"], (i, alone, together)
        if alone["status"] != 200:
            continue
        assert together["text"] == alone["text"] and together["finish"] == alone["finish"], i
        if "ids" in alone:
            assert together["ids"] == alone["ids"], i
            # Same tokens; float rounding depends on the batch shape (see maze_serving.batching).
            assert (
                max(abs(a - b) for a, b in zip(alone["lps"], together["lps"], strict=True)) < 1e-4
            )
    for (_, needle), alone, together in zip(
        bad, solo[len(good) :], batched[len(good) :], strict=True
    ):
        assert alone["status"] == together["status"] == 400
        assert needle in alone["error"] and needle in together["error"]

    # A request is answered when its own row is done, not when the batch's longest one is.
    assert order.index(short) < order.index(long)

    def bucket(le: str) -> float:
        prefix = f'maze_serving_batch_size_bucket{{le="{le}"}} '
        return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(prefix))

    # The eight good base-model requests ran as one generate call (the adapter one on its own).
    assert bucket("8.0") - bucket("4.0") >= 1
