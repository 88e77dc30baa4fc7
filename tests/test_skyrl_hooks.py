"""maze-engine's SkyRL hooks, driven through the signatures SkyRL calls them with.

SkyRL's FSDP worker class imports flash-attn (GPU image only), so the worker override is built
here on a stand-in parent holding what the override reads (``model.model``, ``_is_lora``); the
override itself, a real peft model, a gloo process group, SkyRL's ``RemoteInferenceClient``, a
real local Ray with the head resource and a real ``maze-serve`` engine are what run.
"""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
import torch


@pytest.fixture(scope="module")
def ray_head() -> Iterator[None]:
    from maze_engine.testing import local_ray_head

    with local_ray_head():
        yield


@pytest.fixture(scope="module")
def gloo() -> Iterator[None]:
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class _SkyRLWorkerParent:
    """Stands in for ``FSDPPolicyWorkerBase``: the attributes the override reads."""

    def __init__(self, model: Any) -> None:
        self.model = SimpleNamespace(model=model)
        self._is_lora = True

    def save_hf_model(self, export_dir: str, tokenizer: Any) -> None:
        raise AssertionError("SkyRL's full-model export must not run for a LoRA policy")


def test_worker_override_syncs_through_shards_head_and_engines_and_exports(
    ray_head: None, gloo: None, tmp_path: Path
) -> None:
    from peft import get_peft_model_state_dict  # pyright: ignore[reportUnknownVariableType]
    from safetensors.torch import load_file  # pyright: ignore[reportUnknownVariableType]
    from skyrl.backends.skyrl_train.inference_servers.remote_inference_client import (
        RemoteInferenceClient,
    )

    from maze_engine.lora_sync import SyncLayout, SyncSettings, read_sync_status
    from maze_engine.skyrl_ext import _worker_body  # pyright: ignore[reportPrivateUsage]
    from maze_policy.lora import load_policy, lora_config
    from maze_policy.model import build_tiny_vlm
    from maze_serving.app import create_app
    from maze_serving.engine import EngineConfig
    from maze_serving.server import serve_in_thread
    from weight_sync import AdapterStore

    torch.set_num_threads(1)
    model_dir = build_tiny_vlm(tmp_path / "tiny", seed=0)
    policy = load_policy(model_dir, lora_config(rank=4, alpha=8, dropout=0.0), 1)
    for name, p in policy.model.named_parameters():
        if "lora_B" in name:  # B starts at zero; a nonzero adapter shows it is really applied
            torch.nn.init.normal_(p, std=0.5)
    root = tmp_path / "lora_sync"
    worker_cls = _worker_body(_SkyRLWorkerParent, SyncSettings(root=str(root), cell_px=32))
    worker = worker_cls(policy.model)

    app = create_app(EngineConfig(model_path=str(model_dir), threads=1))
    with serve_in_thread(app, wait_model=True, startup_timeout=120) as url:
        client = RemoteInferenceClient(proxy_url=url, server_urls=[url], data_parallel_size=1)

        async def sync_twice() -> None:
            try:
                for _ in range(2):  # what SkyRL's broadcast_to_inference_engines calls
                    await worker._save_lora_adapters_and_sync(
                        policy.model, str(root), client, "skyrl-lora"
                    )
            finally:
                await client.aclose()

        asyncio.run(sync_twice())
        models = {m["id"]: m for m in httpx.get(f"{url}/v1/models").json()["data"]}
        served = models[f"{model_dir.name}:skyrl-lora"]
        assert served["weight_sync_version"] == 2
        assert served["maze_rendering"] == {"cell_px": 32}

    store = AdapterStore(SyncLayout(root).store_root)
    assert store.versions() == [1, 2] and store.latest_version() == 2
    expected = cast(dict[str, torch.Tensor], get_peft_model_state_dict(policy.model))
    published = load_file(str(store.version_path(2) / "adapter_model.safetensors"))
    assert published.keys() == expected.keys()
    assert all(torch.equal(published[k], v) for k, v in expected.items())
    status = read_sync_status(root)
    assert status["weight_sync/published"] == 2 and status["adapter/version"] == 2

    # hf_save_interval: the same shards + head path, into SkyRL's export folder.
    export = tmp_path / "export" / "global_step_20" / "policy"
    worker.save_hf_model(str(export), tokenizer=None)
    exported = load_file(str(export / "adapter_model.safetensors"))
    assert all(torch.equal(exported[k], v) for k, v in expected.items())
    assert (export / "adapter_config.json").is_file()
    assert not list(export.parent.glob(".*shards"))


def test_prometheus_tracking_exports_skyrl_keys_under_the_local_engines_names(
    tmp_path: Path,
) -> None:
    from maze_engine.lora_sync import SyncLayout
    from maze_engine.metrics import prometheus_name
    from maze_engine.skyrl_ext import PrometheusTracking
    from weight_sync.fs import atomic_write_json

    atomic_write_json(SyncLayout(tmp_path).status_file, {"weight_sync/published": 3.0})
    tracker = PrometheusTracking(
        project_name="mazerl",
        experiment_name="t",
        backend="console",
        sync_root=str(tmp_path),
        prometheus_port=0,
        extra=lambda: {"mirror/s3_failures": 1.0},
    )
    try:
        tracker.log(
            {"reward/avg_raw_reward": 0.25, "timing/step": 1.5, "note": "text is skipped"}, step=7
        )
        port = tracker.sink.prometheus_port
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        text = body.decode()
        values = {
            line.split()[0]: float(line.split()[1])
            for line in text.splitlines()
            if line.startswith("mazerl_")
        }
        assert values[prometheus_name("reward/avg_raw_reward")] == 0.25
        assert values[prometheus_name("timing/step")] == 1.5
        assert values[prometheus_name("weight_sync/published")] == 3.0
        assert values[prometheus_name("mirror/s3_failures")] == 1.0
        assert values["mazerl_global_step"] == 7
        assert not any("note" in k for k in values)
    finally:
        tracker.finish()


class _SkyRLCheckpointParent(_SkyRLWorkerParent):
    """Also stands in for SkyRL's own checkpoint methods (its rank files are not written)."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=1e-2)
        self.scheduler = None
        self.skyrl_loads = 0

    def save_checkpoint(self, ckpt_dir: str, tokenizer: Any = None) -> None:
        Path(ckpt_dir).mkdir(parents=True, exist_ok=True)

    def load_checkpoint(self, ckpt_dir: str, *_: Any) -> dict[str, Any]:
        self.skyrl_loads += 1
        return {}


def test_worker_checkpoints_resume_from_lora_shards_when_skyrl_has_no_rank_files(
    gloo: None, tmp_path: Path
) -> None:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from maze_engine.lora_sync import SyncSettings
    from maze_engine.skyrl_ext import _worker_body  # pyright: ignore[reportPrivateUsage]
    from maze_policy.lora import load_policy, lora_config
    from maze_policy.model import build_tiny_vlm

    torch.set_num_threads(1)
    model_dir = build_tiny_vlm(tmp_path / "tiny", seed=0)

    def worker() -> Any:
        policy = load_policy(model_dir, lora_config(rank=4, alpha=8, dropout=0.0), 1)
        cls = _worker_body(_SkyRLCheckpointParent, SyncSettings(root=str(tmp_path / "sync")))
        return cls(policy.model)

    def state(w: Any) -> dict[str, torch.Tensor]:
        osd: Any = get_optimizer_state_dict(w.model.model, w.optimizer)
        out = {k: v.clone() for k, v in w.model.model.state_dict().items() if "lora_" in k}
        out.update({f"{p}.{f}": v.clone() for p, st in osd["state"].items() for f, v in st.items()})
        return out

    saved = worker()
    ids = torch.randint(0, 50, (1, 12))
    saved.model.model(input_ids=ids).logits.float().pow(2).mean().backward()
    saved.optimizer.step()
    ckpt = tmp_path / "ckpt" / "global_step_1" / "policy"
    saved.save_checkpoint(str(ckpt))
    assert (ckpt / "lora_shards" / "model_world_size_1.index.json").is_file()

    fresh = worker()  # another job: fresh LoRA, empty optimizer
    before, want = state(fresh), state(saved)
    assert any(not torch.equal(before[k], v) for k, v in want.items())  # differs until loaded
    states = fresh.load_checkpoint(str(ckpt))
    assert fresh.skyrl_loads == 0 and states["world_size"] == 1
    got = state(fresh)
    assert want.keys() == got.keys() and any(k.endswith(".exp_avg") for k in want)
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_trainer_mirrors_each_finished_checkpoint_and_the_served_adapter(
    moto_s3: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from skyrl.train.trainer import RayPPOTrainer

    from maze_engine.lora_sync import SyncLayout, SyncSettings
    from maze_engine.skyrl_ext import ClusterSettings, MazeTrainer
    from weight_sync import AdapterStore, BackgroundMirror

    ckpt = tmp_path / "ckpt"

    def skyrl_save(self: Any) -> str:
        # SkyRL's own save needs its GPU workers; this writes the folder it would return.
        folder = ckpt / "global_step_3"
        (folder / "policy").mkdir(parents=True)
        (folder / "trainer_state.pt").write_bytes(b"state")
        (ckpt / "latest_ckpt_global_step.txt").write_text("3")
        return str(folder)

    monkeypatch.setattr(RayPPOTrainer, "save_checkpoints", skyrl_save)
    root = tmp_path / "lora_sync"
    store = AdapterStore(SyncLayout(root).store_root, durable=False)
    from safetensors.torch import save  # pyright: ignore[reportUnknownVariableType]

    store.publish(
        {
            "adapter_model.safetensors": save({"a.lora_A.weight": torch.ones(2, 2)}),
            "adapter_config.json": b'{"peft_type": "LORA", "r": 2}',
        }
    )
    trainer = object.__new__(MazeTrainer)  # SkyRL's __init__ builds datasets and workers
    trainer.maze_settings = ClusterSettings(sync=SyncSettings(root=str(root)))
    mirror = BackgroundMirror("s3://mazerl/runs/r1", retry_initial_s=0.2, retry_max_s=1.0)
    trainer.mirror = mirror
    assert trainer.save_checkpoints() == str(ckpt / "global_step_3")
    stats = mirror.close(timeout=60)
    assert stats.uploaded == 2 and stats.failures == 0, stats
    keys = {o["Key"] for o in moto_s3.list_objects_v2(Bucket="mazerl")["Contents"]}
    assert "runs/r1/global_step_3/trainer_state.pt" in keys
    assert "runs/r1/v000000001/adapter_model.safetensors" in keys
