"""LoRA sync's bad input: no head node, corrupt shards, unreachable or refusing engines.

A real local Ray (the head resource declared), shards written by lora-consolidate, a real HTTP
server on 127.0.0.1 for an engine that refuses, SkyRL's ``RemoteInferenceClient`` as the client.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import socket
import threading
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from lora_consolidate import ShardError
from maze_engine.errors import AdapterRefusedError, EngineSyncError, HeadNodeMissingError
from maze_engine.lora_sync import (
    ENGINES_READER,
    HEAD_RESOURCE,
    EngineHandover,
    ShardedLoraSync,
    SyncLayout,
    SyncSettings,
    on_head,
    read_sync_status,
    require_head_node,
)
from weight_sync import AdapterStore

CONFIG = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    prefix = "base_model.model.model.language_model.layers.0.self_attn.q_proj"
    return {
        f"{prefix}.lora_A.default.weight": torch.randn(2, 8, generator=g),
        f"{prefix}.lora_B.default.weight": torch.randn(8, 2, generator=g),
    }


@pytest.fixture(scope="module")
def ray_head() -> Iterator[None]:
    from maze_engine.testing import local_ray_head

    with local_ray_head():
        yield


class _Refusing(http.server.BaseHTTPRequestHandler):
    """An engine that answers every load as vLLM does a bad adapter: 400 with a JSON error."""

    calls = 0

    def do_POST(self) -> None:
        type(self).calls += 1
        body = json.dumps({"error": {"message": "Invalid LoRA adapter", "code": 400}}).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def refusing_engine() -> Generator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed once the socket is


def _client(urls: list[str]) -> Any:
    from skyrl.backends.skyrl_train.inference_servers.remote_inference_client import (
        RemoteInferenceClient,
    )

    return RemoteInferenceClient(proxy_url=urls[0], server_urls=urls, data_parallel_size=1)


async def _no_sleep(_: float) -> None:
    return None


def test_a_cluster_without_the_head_resource_is_a_named_error(ray_head: None) -> None:
    require_head_node(HEAD_RESOURCE)
    with pytest.raises(HeadNodeMissingError, match="ray start --head --resources"):
        require_head_node("no_such_head")


def test_head_task_publishes_and_a_corrupt_shard_publishes_nothing(
    ray_head: None, tmp_path: Path
) -> None:
    from lora_consolidate.shards import data_file_name, write_rank_shards

    layout = SyncLayout(tmp_path)
    store = AdapterStore(layout.store_root)
    state = _state(0)
    write_rank_shards(state, layout.shard_dir(1), 0, 1)
    report = on_head(
        str(layout.shard_dir(1)),
        str(layout.staging_dir(1)),
        1,
        adapter_config=CONFIG,
        store_root=str(layout.store_root),
        version=1,
        cell_px=32,
    )
    assert report.version == 1 and store.latest_version() == 1
    assert report.work_peak_bytes <= report.memory_bound_bytes
    published = store.get(1)
    assert json.loads((published.path / "maze_rendering.json").read_text())["cell_px"] == 32
    assert not layout.shard_dir(1).exists()  # removed once the version is safe

    write_rank_shards(_state(1), layout.shard_dir(2), 0, 1)
    data = layout.shard_dir(2) / data_file_name("model", 1, 0)
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(ShardError):
        on_head(
            str(layout.shard_dir(2)),
            str(layout.staging_dir(2)),
            1,
            adapter_config=CONFIG,
            store_root=str(layout.store_root),
            version=2,
        )
    assert store.latest_version() == 1  # nothing half-published
    assert data.exists()  # the shards stay for inspection

    with pytest.raises(ShardError):  # a rank that never wrote its shards
        on_head(
            str(layout.shard_dir(1)),
            str(layout.staging_dir(1)),
            2,
            adapter_config=CONFIG,
            store_root=str(layout.store_root),
            version=2,
        )


def test_unreachable_engines_are_retried_then_named_and_counted(
    ray_head: None, tmp_path: Path
) -> None:
    layout = SyncLayout(tmp_path)
    sync = ShardedLoraSync(SyncSettings(root=str(tmp_path), retries=2))
    url = _closed_port()

    async def run() -> None:
        client = _client([url])
        sync.attach(client, "skyrl-lora")
        assert sync._handover is not None  # pyright: ignore[reportPrivateUsage]
        sync._handover._sleep = _no_sleep  # pyright: ignore[reportPrivateUsage]
        try:
            await sync.sync(
                _state(0),
                CONFIG,
                rank=0,
                world_size=1,
                client=client,
                lora_name="skyrl-lora",
                barrier=lambda: None,
            )
        finally:
            await client.aclose()

    with pytest.raises(EngineSyncError, match="after 3 attempts"):
        asyncio.run(run())
    status = read_sync_status(tmp_path)
    assert status["weight_sync/failures_unreachable"] == 3.0
    assert status["weight_sync/published"] == 1.0 and status["weight_sync/handovers"] == 0.0
    store = AdapterStore(layout.store_root)
    assert store.latest_version() == 1  # published and intact; served by nobody yet
    assert [x for x in store.leases() if x.reader == ENGINES_READER] == []


def test_a_refused_version_is_not_retried_and_the_served_version_stays_leased(
    ray_head: None, tmp_path: Path
) -> None:
    layout = SyncLayout(tmp_path)
    store = AdapterStore(layout.store_root)
    from safetensors.torch import save  # pyright: ignore[reportUnknownVariableType]

    for seed in (0, 1):
        weights = {k.replace(".default", ""): v for k, v in _state(seed).items()}
        store.publish(
            {
                "adapter_model.safetensors": save(weights),
                "adapter_config.json": json.dumps(CONFIG).encode(),
            }
        )

    class Loader:
        def __init__(self) -> None:
            self.paths: list[str] = []

        async def load_lora_adapter(self, lora_name: str, lora_path: str | None = None) -> None:
            self.paths.append(str(lora_path))

    ok = Loader()
    handover = EngineHandover(ok, layout, "skyrl-lora")
    asyncio.run(handover.load(1))
    assert ok.paths == [str(store.version_path(1))]
    assert [x.version for x in store.leases() if x.reader == ENGINES_READER] == [1]

    with refusing_engine() as url:
        client = _client([url])
        refusing = EngineHandover(client, layout, "skyrl-lora", stats=handover.stats)
        refusing.adopt_lease(handover.take_lease())

        async def load() -> None:
            try:
                await refusing.load(2)
            finally:
                await client.aclose()

        with pytest.raises(AdapterRefusedError, match="HTTP 400"):
            asyncio.run(load())
    assert _Refusing.calls == 1  # a refusal is an answer: not retried
    assert handover.stats.failures == {"refused": 1}
    # The engines still serve version 1, so it stays leased; version 2's lease was dropped.
    assert [x.version for x in store.leases() if x.reader == ENGINES_READER] == [1]
    report = store.gc(keep=1)
    assert 1 not in report.removed
    refusing.close()
    assert [x for x in store.leases() if x.reader == ENGINES_READER] == []
