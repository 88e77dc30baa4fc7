"""SkyRL's control-plane LoRA load (``/skyrl/v1/load_lora_adapter``): in place, verified.

Driven with SkyRL's own ``RemoteInferenceClient`` where it is installed (it is a maze-engine
dependency), as the cluster trainer drives the engines.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest

from weight_sync import AdapterStore

BASE = "tiny"
NAME = "skyrl-lora"
ServerFactory = Callable[..., AbstractContextManager[str]]


def _logprobs(url: str, model: str, messages: list[dict[str, Any]]) -> list[float]:
    body = {"model": model, "messages": messages, "max_tokens": 4, "temperature": 0}
    r = httpx.post(
        f"{url}/v1/chat/completions",
        json={**body, "logprobs": True, "ignore_eos": True},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return [t["logprob"] for t in r.json()["choices"][0]["logprobs"]["content"]]


def _load(url: str, name: str, path: str) -> httpx.Response:
    return httpx.post(
        f"{url}/skyrl/v1/load_lora_adapter",
        json={"lora_name": name, "lora_path": path},
        timeout=60,
    )


def _served(url: str) -> dict[str, Any]:
    return {m["id"]: m for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]}


def test_reload_replaces_in_place_and_reports_the_verified_version(
    server: str, adapters: list[Path], tmp_path: Path, maze_messages: list[dict[str, Any]]
) -> None:
    store = AdapterStore(tmp_path / "sync", durable=False)
    v1 = store.publish(adapters[0], step=1)
    v2 = store.publish(adapters[1], step=2)
    base_lp = _logprobs(server, BASE, maze_messages)

    r = _load(server, NAME, str(v1.path))
    assert r.status_code == 200 and "version 1" in r.text, r.text
    # Its token series exist before its first request, so rate() counts that one too.
    metrics = httpx.get(f"{server}/metrics", timeout=10).text
    assert f'maze_serving_generation_tokens_total{{model="{BASE}:{NAME}"}}' in metrics
    first = _logprobs(server, NAME, maze_messages)
    assert _served(server)[f"{BASE}:{NAME}"]["weight_sync_version"] == 1
    assert first != base_lp  # the adapter is applied

    r = _load(server, NAME, str(v2.path))  # the same name again: replaced, not refused
    assert r.status_code == 200, r.text
    second = _logprobs(server, NAME, maze_messages)
    served = _served(server)
    assert served[f"{BASE}:{NAME}"]["weight_sync_version"] == 2
    assert second != first
    assert not any("@" in mid for mid in served)  # internal names stay internal

    # A plain adapter directory (no manifest) loads too, with no version to report.
    r = _load(server, NAME, str(adapters[0]))
    assert r.status_code == 200, r.text
    assert "weight_sync_version" not in _served(server)[f"{BASE}:{NAME}"]
    assert _logprobs(server, NAME, maze_messages) == first

    # vLLM's own load refuses the name while it is loaded; its unload takes it away.
    r = httpx.post(
        f"{server}/v1/load_lora_adapter", json={"lora_name": NAME, "lora_path": str(v1.path)}
    )
    assert r.status_code == 400, r.text
    r = httpx.post(f"{server}/v1/unload_lora_adapter", json={"lora_name": NAME})
    assert r.status_code == 200, r.text
    assert f"{BASE}:{NAME}" not in _served(server)


def test_reload_refuses_an_altered_version_and_keeps_serving_the_last_good_one(
    server: str, adapters: list[Path], tmp_path: Path, maze_messages: list[dict[str, Any]]
) -> None:
    store = AdapterStore(tmp_path / "sync", durable=False)
    good = store.publish(adapters[0], step=1)
    bad = store.publish(adapters[1], step=2)
    assert _load(server, NAME, str(good.path)).status_code == 200
    before = _logprobs(server, NAME, maze_messages)

    weights = bad.path / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # a torn or altered file: same size, different bytes
    weights.write_bytes(bytes(data))
    r = _load(server, NAME, str(bad.path))
    assert r.status_code == 400, r.text
    assert "refusing adapter" in r.json()["error"]["message"]
    assert _served(server)[f"{BASE}:{NAME}"]["weight_sync_version"] == 1
    assert _logprobs(server, NAME, maze_messages) == before


@pytest.mark.parametrize("name", ["", "a:b", "a@b", "latest"])
def test_reload_rejects_reserved_names(server: str, adapters: list[Path], name: str) -> None:
    r = _load(server, name, str(adapters[0]))
    assert r.status_code in (400, 422), r.text
    assert NAME not in str(_served(server))


def test_skyrl_remote_client_fans_the_load_out_to_every_engine(
    start_server: ServerFactory, adapters: list[Path], tmp_path: Path
) -> None:
    client_mod = pytest.importorskip(
        "skyrl.backends.skyrl_train.inference_servers.remote_inference_client"
    )
    store = AdapterStore(tmp_path / "sync", durable=False)
    v1 = store.publish(adapters[0], step=1)
    with start_server() as a, start_server() as b:
        client = client_mod.RemoteInferenceClient(
            proxy_url=a, server_urls=[a, b], data_parallel_size=1
        )

        async def load() -> dict[str, Any]:
            try:
                return await client.load_lora_adapter(NAME, str(v1.path))
            finally:
                await client.aclose()

        out = asyncio.run(load())
        assert set(out) == {a, b}
        for url in (a, b):
            assert _served(url)[f"{BASE}:{NAME}"]["weight_sync_version"] == 1
