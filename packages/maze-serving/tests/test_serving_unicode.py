"""Text that is not valid Unicode (a lone surrogate) is a 400 naming the field, on every route."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

BASE = "tiny"
BAD = "\ud800"
IMAGE = "data:image/png;base64,iVBORw0KGgo="


def send(url: str, path: str, body: Any) -> httpx.Response:
    # json.dumps writes the lone surrogate as the valid JSON escape "\ud800" (httpx's json=
    # would refuse to encode it).
    return httpx.post(
        f"{url}{path}",
        content=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        timeout=60,
    )


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": BASE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **kw}


def text_part(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": text}]}]


CHAT_CASES: list[tuple[dict[str, Any], str]] = [
    (chat(model=BAD), "body.model"),
    (chat(messages=[{"role": "user", "content": f"a{BAD}b"}]), "body.messages.0.content"),
    (chat(messages=text_part(BAD)), "body.messages.0.content.0.text"),
    (chat(messages=[{"role": BAD, "content": "hi"}]), "body.messages.0.role"),
    (
        chat(messages=[{"role": "user", "content": [{"type": BAD}]}]),
        "body.messages.0.content.0.type",
    ),
    (
        chat(
            messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": BAD}}]}
            ]
        ),
        "body.messages.0.content.0.image_url.url",
    ),
    (
        chat(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": IMAGE, "detail": BAD}},
                        {"type": "text", "text": "x"},
                    ],
                }
            ]
        ),
        "body.messages.0.content.0.image_url.detail",
    ),
    (
        chat(messages=[{"role": "system", "content": BAD}, {"role": "user", "content": "hi"}]),
        "body.messages.0.content",
    ),
    (
        chat(
            messages=[
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "\udc00"},
                {"role": "user", "content": "hi"},
            ]
        ),
        "body.messages.1.content",
    ),
    (chat(user=BAD), "body.user"),  # extra OpenAI fields are ignored, but still checked
    (chat(stream=True, stream_options={"x": BAD}), "body.stream_options.x"),
    (chat(stream=True, messages=text_part(BAD)), "body.messages.0.content.0.text"),
    ({**chat(), BAD: 1}, "body: a key"),
]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/invocations"])
def test_chat_routes_refuse_lone_surrogates(server: str, path: str) -> None:
    for body, field in CHAT_CASES:
        r = send(server, path, body)
        assert r.status_code == 400, (field, r.text)
        assert r.headers["content-type"] == "application/json"
        err = r.json()["error"]
        assert err["code"] == 400 and err["type"] == "invalid_request_error"
        assert f"{field}" in err["message"] and "not valid Unicode" in err["message"], err
    # Raw UTF-8 bytes of a surrogate decode to the same lone surrogate: same answer.
    raw = json.dumps(chat(messages=text_part("\ud800x")), ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )
    r = httpx.post(f"{server}{path}", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "body.messages.0.content.0.text" in r.json()["error"]["message"]
    # A surrogate *pair* is one valid character; the server still answers normally.
    ok = send(server, path, chat(messages=text_part("\ud83d\ude00 \u00e9")))
    assert ok.status_code == 200, ok.text


def test_lora_routes_refuse_lone_surrogates(server: str) -> None:
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("/v1/load_lora_adapter", {"lora_name": BAD, "lora_path": "/x"}, "body.lora_name"),
        ("/v1/load_lora_adapter", {"lora_name": "a", "lora_path": f"/x/{BAD}"}, "body.lora_path"),
        (
            "/v1/load_lora_adapter",
            {"lora_name": "a", "lora_path": f"s3://b/{BAD}"},
            "body.lora_path",
        ),
        ("/v1/unload_lora_adapter", {"lora_name": BAD}, "body.lora_name"),
    ]
    for path, body, field in cases:
        r = send(server, path, body)
        assert r.status_code == 400, (path, field, r.text)
        assert field in r.json()["error"]["message"], r.text
    assert [m["id"] for m in httpx.get(f"{server}/v1/models").json()["data"]] == [BASE]
