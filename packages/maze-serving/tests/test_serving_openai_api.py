"""OpenAI-compatible routes against a real uvicorn server: models, chat (image, stream), LoRA."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest

BASE = "tiny"
ServerFactory = Callable[..., AbstractContextManager[str]]


def chat(url: str, model: str, messages: list[dict[str, Any]], **kw: Any) -> httpx.Response:
    body = {"model": model, "messages": messages, **kw}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)


def test_models_lists_base_and_startup_adapters(
    start_server: ServerFactory, adapters: list[Path]
) -> None:
    with start_server(adapters={"a1": str(adapters[0])}) as url:
        r = httpx.get(f"{url}/v1/models")
        assert r.status_code == 200
        body = r.json()
        ids = [m["id"] for m in body["data"]]
        assert body["object"] == "list" and ids == [BASE, f"{BASE}:a1"]
        assert body["data"][1]["parent"] == BASE


def test_chat_completion_with_maze_image(server: str, maze_messages: list[dict[str, Any]]) -> None:
    r = chat(server, BASE, maze_messages, max_tokens=6, temperature=0)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == BASE
    assert body["id"].startswith("chatcmpl-") and isinstance(body["created"], int)
    choice = body["choices"][0]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    # The token-aligned maze image alone is dozens of visual tokens.
    assert usage["prompt_tokens"] > 50
    assert 1 <= usage["completion_tokens"] <= 6
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_seeded_sampling_is_deterministic(server: str, maze_messages: list[dict[str, Any]]) -> None:
    kw: dict[str, Any] = {"max_tokens": 12, "temperature": 1.0, "top_p": 0.95, "logprobs": True}
    a = chat(server, BASE, maze_messages, seed=7, **kw).json()["choices"][0]
    b = chat(server, BASE, maze_messages, seed=7, **kw).json()["choices"][0]
    c = chat(server, BASE, maze_messages, seed=8, **kw).json()["choices"][0]
    ids = [[t["token_id"] for t in x["logprobs"]["content"]] for x in (a, b, c)]
    assert ids[0] == ids[1] and a["message"] == b["message"]
    assert ids[0] != ids[2]  # a random tiny model: near-uniform over ~1000 tokens


def test_streaming_matches_non_streaming(server: str, maze_messages: list[dict[str, Any]]) -> None:
    kw: dict[str, Any] = {"max_tokens": 10, "temperature": 0, "ignore_eos": True}
    full = chat(server, BASE, maze_messages, **kw).json()
    body = {"model": BASE, "messages": maze_messages, "stream": True, **kw}
    body["stream_options"] = {"include_usage": True}
    events: list[str] = []
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == full["choices"][0]["message"]["content"]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert chunks[-1]["usage"] == full["usage"]


def _logprobs(url: str, model: str, messages: list[dict[str, Any]]) -> list[float]:
    r = chat(url, model, messages, max_tokens=8, temperature=0, logprobs=True, ignore_eos=True)
    assert r.status_code == 200, r.text
    return [t["logprob"] for t in r.json()["choices"][0]["logprobs"]["content"]]


def test_load_and_unload_lora_adapter(
    server: str, adapters: list[Path], maze_messages: list[dict[str, Any]]
) -> None:
    base = _logprobs(server, BASE, maze_messages)
    r = httpx.post(
        f"{server}/v1/load_lora_adapter", json={"lora_name": "a1", "lora_path": str(adapters[0])}
    )
    assert r.status_code == 200, r.text
    assert f"{BASE}:a1" in [m["id"] for m in httpx.get(f"{server}/v1/models").json()["data"]]
    with_a1 = _logprobs(server, f"{BASE}:a1", maze_messages)
    assert with_a1 != base
    # vLLM style: the bare adapter name selects it too; the base is unchanged by the load.
    assert _logprobs(server, "a1", maze_messages) == with_a1
    assert _logprobs(server, BASE, maze_messages) == base

    again = httpx.post(
        f"{server}/v1/load_lora_adapter", json={"lora_name": "a1", "lora_path": str(adapters[1])}
    )
    assert again.status_code == 400 and "already loaded" in again.json()["error"]["message"]
    missing = httpx.post(
        f"{server}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/nonexistent/dir"}
    )
    assert missing.status_code == 404 and missing.json()["error"]["code"] == 404

    r = httpx.post(f"{server}/v1/unload_lora_adapter", json={"lora_name": "a1"})
    assert r.status_code == 200
    gone = chat(server, f"{BASE}:a1", maze_messages, max_tokens=2)
    assert gone.status_code == 404 and gone.json()["error"]["type"] == "not_found_error"
    assert (
        httpx.post(f"{server}/v1/unload_lora_adapter", json={"lora_name": "a1"}).status_code == 404
    )
    assert [m["id"] for m in httpx.get(f"{server}/v1/models").json()["data"]] == [BASE]
    # The name is free again after unloading.
    r = httpx.post(
        f"{server}/v1/load_lora_adapter", json={"lora_name": "a1", "lora_path": str(adapters[1])}
    )
    assert r.status_code == 200
    assert _logprobs(server, f"{BASE}:a1", maze_messages) not in (base, with_a1)


def test_metrics_count_requests_tokens_and_latency(
    server: str, maze_messages: list[dict[str, Any]]
) -> None:
    for _ in range(2):
        assert chat(server, BASE, maze_messages, max_tokens=3, ignore_eos=True).status_code == 200
    assert chat(server, "nope", maze_messages).status_code == 404
    text = httpx.get(f"{server}/metrics").text
    lines = text.splitlines()

    def value(prefix: str) -> float:
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines if ln.startswith(prefix))

    assert value('maze_serving_requests_total{endpoint="/v1/chat/completions",status="200"}') == 2
    assert value('maze_serving_requests_total{endpoint="/v1/chat/completions",status="404"}') == 1
    assert value('maze_serving_generation_tokens_total{model="tiny"}') == 6
    assert value('maze_serving_prompt_tokens_total{model="tiny"}') > 100
    assert (
        value('maze_serving_e2e_request_latency_seconds_count{endpoint="/v1/chat/completions"}')
        == 2
    )
    assert value("maze_serving_active_adapter_version") == -1
    assert value("maze_serving_num_requests_running") == 0


def test_models_list_the_rendering_an_adapter_records(
    server: str, adapters: list[Path], tmp_path: Path
) -> None:
    from maze_env.render import RENDERING_FILE, Style, write_rendering

    recorded = tmp_path / "recorded"
    shutil.copytree(adapters[0], recorded)
    write_rendering(recorded, Style(cell_px=25))
    r = httpx.post(
        f"{server}/v1/load_lora_adapter", json={"lora_name": "r25", "lora_path": str(recorded)}
    )
    assert r.status_code == 200, r.text
    models = {m["id"]: m for m in httpx.get(f"{server}/v1/models").json()["data"]}
    assert models[f"{BASE}:r25"]["maze_rendering"] == {"cell_px": 25}
    assert "maze_rendering" not in models[BASE]  # the base records nothing
    bad = tmp_path / "bad"
    shutil.copytree(adapters[0], bad)
    (bad / RENDERING_FILE).write_text('{"cell_px": "wide"}')
    r = httpx.post(
        f"{server}/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": str(bad)}
    )
    assert r.status_code == 400 and RENDERING_FILE in r.json()["error"]["message"]
    assert (
        httpx.post(f"{server}/v1/unload_lora_adapter", json={"lora_name": "r25"}).status_code == 200
    )


def test_an_adapter_trained_in_another_context_is_served_with_a_warning(
    server: str, adapters: list[Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from maze_policy.contexts import CONTEXT_FILE, write_context

    route = tmp_path / "route"
    shutil.copytree(adapters[0], route)
    write_context(route, "route")
    with caplog.at_level(logging.WARNING, logger="maze_serving.engine"):
        r = httpx.post(
            f"{server}/v1/load_lora_adapter", json={"lora_name": "rt", "lora_path": str(route)}
        )
    assert r.status_code == 200, r.text
    assert "adapter rt was trained in context 'route'; this server answers in 'full'" in (
        caplog.text
    )
    assert (
        httpx.post(f"{server}/v1/unload_lora_adapter", json={"lora_name": "rt"}).status_code == 200
    )
    bad = tmp_path / "bad"
    shutil.copytree(adapters[0], bad)
    (bad / CONTEXT_FILE).write_text("[]")
    r = httpx.post(
        f"{server}/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": str(bad)}
    )
    assert r.status_code == 400 and CONTEXT_FILE in r.json()["error"]["message"]


def test_a_per_turn_context_answers_the_turn_the_policy_was_trained_on(
    start_server: ServerFactory, maze_messages: list[dict[str, Any]]
) -> None:
    """A client sending the whole conversation gets what the trimmed turn gets, images and all."""
    from maze_policy.contexts import ROUTE_QUESTION

    system, first = maze_messages[0], maze_messages[1:]
    frame = first[-1]["content"][0]
    feedback = [
        {
            "role": "user",
            "content": [
                *first[-1]["content"][:1],
                {"type": "text", "text": "Moved. Turns left: 9."},
            ],
        }
    ]
    reply = {"role": "assistant", "content": "<action>right</action>"}
    # Twenty earlier turns: more images than the server takes in one request.
    history = [system, *first, *([reply, *feedback] * 20)]
    kw: dict[str, Any] = {"max_tokens": 8, "temperature": 1.0, "seed": 3, "logprobs": True}

    def tokens(url: str, messages: list[dict[str, Any]]) -> list[int]:
        r = chat(url, BASE, messages, **kw)
        assert r.status_code == 200, r.text
        return [t["token_id"] for t in r.json()["choices"][0]["logprobs"]["content"]]

    with start_server(context="latest", max_images=4) as url:
        latest = tokens(url, history)
        assert latest == tokens(url, [system, *feedback])
        assert tokens(url, maze_messages) == tokens(url, [system, *first])
    with start_server(context="recent", max_images=4) as url:
        recent = tokens(url, history)
        assert recent == tokens(url, [system, reply, *feedback])
    question = {"type": "text", "text": ROUTE_QUESTION}
    with start_server(context="route", max_images=4) as url:
        # The last frame asked the route question, whatever text came with it.
        route = tokens(url, history)
        assert route == tokens(url, [{"role": "user", "content": [frame, question]}])
        assert tokens(url, maze_messages) == route  # the opening shows the same frame
        r = chat(url, BASE, [system, {"role": "user", "content": "which way?"}], **kw)
        assert r.status_code == 400 and "context 'route' answers the frame" in r.text
    with start_server(context="route-recent", max_images=4) as url:
        # The route turn after the last reply; an opening has none, so it is route's.
        came = tokens(url, history)
        assert came == tokens(url, [reply, {"role": "user", "content": [frame, question]}])
        assert came != route and tokens(url, maze_messages) == route
    with start_server(max_images=4) as url:  # full: the conversation as sent, so over the limit
        r = chat(url, BASE, history, **kw)
        assert r.status_code == 413 and "more than 4 images" in r.text
        assert tokens(url, [system, *feedback]) == latest != recent
        assert tokens(url, [{"role": "user", "content": [frame, question]}]) == route
