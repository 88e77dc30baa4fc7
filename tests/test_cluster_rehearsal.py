"""Dress rehearsal of the cluster run on this machine (the long test; see ``rehearsal.py``).

A Ray head with the head resource and a worker node (``ray start``), a shared directory for
``/shared``, a moto server for S3, a real Prometheus scraping the trainer, two ``maze-serve``
engines. The policy is trained by 2 FSDP ranks (gloo) on the worker node; after each update the
ranks write LoRA shards, the head-node task consolidates and publishes them through
weight-sync, and SkyRL's ``RemoteInferenceClient`` has both engines load the version. Midway the
worker node is SIGKILLed; a replacement node resumes from the last checkpoint at another world
size, optimizer state included.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import rehearsal as rh

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

LORA = "skyrl-lora"  # SkyRL's SKYRL_LORA_ADAPTER_NAME: what its generator asks the engines for
PROMPTS, SAMPLES, STEPS, KILL_AT = 2, 4, 4, 3


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smoke_5x5 base after a 3-step warm start: replies vary enough to score differently."""
    from maze_engine.testing import warm_started_base

    torch.set_num_threads(1)
    return warm_started_base(tmp_path_factory.mktemp("base"))


def _need_prometheus() -> None:
    if shutil.which("prometheus") is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is not installed (.ci/run installs Debian's package)")
        pytest.skip("needs Debian's prometheus package (apt-get install -y prometheus)")


def _advantages(rewards: list[float]) -> list[float]:
    """SkyRL's GRPO outcome advantage, one value per episode (groups of SAMPLES)."""
    from skyrl.backends.skyrl_train.utils import ppo_utils

    r = torch.tensor(rewards, dtype=torch.float32)[:, None]
    grpo: Any = getattr(ppo_utils, "compute_grpo_outcome_advantage")  # noqa: B009 - untyped
    adv, _ = grpo(
        token_level_rewards=r,
        response_mask=torch.ones_like(r),
        index=np.array([i // SAMPLES for i in range(len(rewards))]),
    )
    return [float(a) for a in cast(torch.Tensor, adv)[:, 0]]


async def _rollouts(urls: list[str], rows: list[dict[str, Any]], step: int) -> list[Any]:
    from skyrl.backends.skyrl_train.inference_servers.remote_inference_client import (
        RemoteInferenceClient,
    )

    # One client per engine as SkyRL's router would spread them: each its own data plane.
    clients = [
        RemoteInferenceClient(proxy_url=u, server_urls=[u], data_parallel_size=1) for u in urls
    ]
    try:
        jobs = [
            rh.play(
                clients[k % len(clients)],
                rows[k // SAMPLES],
                LORA,
                seed=step * 100 + k,
                max_turns=4,
                max_tokens=16,
            )
            for k in range(len(rows) * SAMPLES)
        ]
        return list(await asyncio.gather(*jobs))
    finally:
        for c in clients:
            await c.aclose()


def _ranks(world: int, model_dir: Path, overrides: list[str]) -> list[Any]:
    import ray

    actor: Any = cast(Any, ray.remote)(rh.PolicyRank).options(
        num_cpus=0, resources={rh.WORKER_RESOURCE: 1}, max_restarts=0
    )
    port = rh.free_port()
    ranks = [actor.remote(r, world, port, str(model_dir), overrides) for r in range(world)]
    ray.get([r.node_id.remote() for r in ranks], timeout=300)
    return ranks


def test_cluster_rehearsal_syncs_publishes_mirrors_and_survives_node_loss(
    base_model: Path, moto_s3: Any, tmp_path: Path
) -> None:
    _need_prometheus()
    import ray
    import ray.cloudpickle
    from ray.exceptions import RayActorError
    from safetensors.torch import load_file  # pyright: ignore[reportUnknownVariableType]

    from maze_engine.config import load_config
    from maze_engine.lora_sync import SyncLayout
    from maze_engine.metrics import mirror_metrics
    from maze_engine.skyrl_ext import PrometheusTracking
    from maze_engine.trainer import prepare_data
    from weight_sync import AdapterStore, BackgroundMirror
    from weight_sync.fs import atomic_write_json, atomic_write_text

    run = tmp_path / "shared" / "runs" / "rehearsal"
    overrides = [
        f"trainer.export_path={run}",
        "mazes.train_size=8",
        "mazes.reward_spec=visgym_sft",  # partial credit per well-formed turn: rewards vary
        "local.progress=false",
    ]
    config = load_config("smoke_5x5", overrides)
    rows = [dict(r) for r in prepare_data(config).train]
    layout = SyncLayout(Path(config.skyrl.trainer.policy.model.lora.lora_sync_path))
    ckpt_root = Path(config.skyrl.trainer.ckpt_path)
    logs = tmp_path / "logs"
    logs.mkdir()

    ray.cloudpickle.register_pickle_by_value(rh)  # the actor class travels with the calls
    port = rh.free_port()
    ray_tmp = Path(tempfile.mkdtemp(prefix="rh", dir="/tmp"))  # short: Ray's socket paths
    nodes = [rh.start_head(port, logs / "head.log", ray_tmp)]
    engines: list[Any] = []
    mirror = BackgroundMirror("s3://mazerl/runs/rehearsal", retry_initial_s=0.2, retry_max_s=1.0)
    tracker: Any = None
    try:
        rh.connect(port)
        rh.wait_nodes("mazerl_head")
        nodes.append(rh.start_worker(port, logs / "worker.log"))
        worker_id = rh.wait_nodes(rh.WORKER_RESOURCE)
        urls: list[str] = []
        for i in range(2):
            p = rh.free_port()
            engines.append(rh.start_engine(base_model, p, logs / f"engine{i}.log"))
            urls.append(f"http://127.0.0.1:{p}")
        for u in urls:
            rh.wait_ready(u)

        tracker = PrometheusTracking(
            project_name="mazerl",
            experiment_name="rehearsal",
            backend="console",
            sync_root=str(layout.root),
            prometheus_port=0,
            extra=lambda: mirror_metrics(mirror),
        )
        with rh.prometheus(tracker.sink.prometheus_port or 0, tmp_path) as prom:
            ranks = _ranks(2, base_model, overrides)
            nodes_now = cast(list[dict[str, Any]], ray.nodes())
            head_id = next(str(n["NodeID"]) for n in nodes_now if n["Resources"].get("mazerl_head"))
            assert all(ray.get(r.node_id.remote()) != head_id for r in ranks)

            reports: list[dict[str, Any]] = []

            def sync(step: int) -> dict[str, Any]:
                out = ray.get([r.sync_weights.remote(urls, LORA, step) for r in ranks])
                report = out[0]
                assert report is not None and out[1:] == [None] * (len(out) - 1)
                # Ran on the head node, within lora-consolidate's memory bound.
                assert report["node_id"] == head_id
                assert report["work_peak_bytes"] <= report["bound"], report
                # Both engines now serve exactly this version, verified on load.
                for u in urls:
                    assert rh.served_versions(u, LORA) == [report["version"]]
                # The published adapter is the ranks' LoRA, gathered, byte for byte.
                full = ray.get([r.lora_full.remote() for r in ranks])[0]
                published = load_file(str(Path(report["path"]) / "adapter_model.safetensors"))
                assert len(published) == len(full)
                for k, v in full.items():
                    assert torch.equal(published[k.replace(".default", "")], v), k
                reports.append(report)
                return report

            sync(0)  # SkyRL syncs the initial weights before the first rollout
            step, resumed_at = 0, None
            optim_at_ckpt: dict[str, Any] | None = None
            while step < STEPS:
                batch_rows = [rows[(step * PROMPTS + i) % len(rows)] for i in range(PROMPTS)]
                played = asyncio.run(_rollouts(urls, batch_rows, step))
                rewards = [r for _, r in played]
                advantages = _advantages(rewards)
                conversations = [m for m, _ in played]
                if step + 1 == KILL_AT and resumed_at is None:
                    inflight = [r.train.remote(conversations, advantages) for r in ranks]
                    nodes[1].kill()  # the GPU node is lost mid-update
                    with pytest.raises(RayActorError):
                        ray.get(inflight, timeout=120)
                    # RayJob's retry: a replacement node, fewer GPUs, same checkpoint.
                    nodes[1] = rh.start_worker(port, logs / "worker2.log")
                    rh.wait_nodes(rh.WORKER_RESOURCE, gone=[worker_id])
                    last = int((ckpt_root / "latest_ckpt_global_step.txt").read_text())
                    ranks = _ranks(1, base_model, overrides)
                    ray.get(ranks[0].load.remote(str(ckpt_root / f"global_step_{last}" / "policy")))
                    assert ray.get(ranks[0].optimizer_steps.remote()) == last
                    restored = cast(dict[str, Any], ray.get(ranks[0].optim_full.remote()))
                    assert optim_at_ckpt is not None and restored.keys() == optim_at_ckpt.keys()
                    for k, v in optim_at_ckpt.items():
                        assert torch.equal(restored[k], v), k
                    before = reports[-1]["digest"]
                    assert sync(last)["digest"] == before  # the same adapter, re-published
                    step, resumed_at = last, last
                    continue
                metrics = ray.get([r.train.remote(conversations, advantages) for r in ranks])[0]
                step += 1
                sync(step)
                # A SkyRL-layout checkpoint: the ranks' shards, trainer state, pointer last.
                folder = ckpt_root / f"global_step_{step}"
                ray.get([r.save.remote(str(folder / "policy"), step) for r in ranks])
                optim_at_ckpt = ray.get([r.optim_full.remote() for r in ranks])[0]
                atomic_write_json(folder / "trainer_state.json", {"global_step": step})
                atomic_write_text(ckpt_root / "latest_ckpt_global_step.txt", str(step))
                mirror.submit(folder)
                mirror.submit(Path(reports[-1]["path"]))
                tracker.log(
                    {
                        **metrics,
                        "reward/avg_raw_reward": float(np.mean(rewards)),
                        "trainer/global_step": step,
                    },
                    step,
                )

            assert resumed_at == KILL_AT - 1 and step == STEPS
            store = AdapterStore(layout.store_root)
            versions = [r["version"] for r in reports]
            assert versions == sorted(versions) and len(set(versions)) == len(versions)
            assert store.latest_version() == versions[-1]
            assert not any((layout.root / "shards").glob("v*"))  # shards removed once published

            stats = mirror.close(timeout=60)
            assert stats.failures == 0 and stats.pending == 0, stats
            keys = {
                o["Key"]
                for page in moto_s3.get_paginator("list_objects_v2").paginate(Bucket="mazerl")
                for o in page.get("Contents", [])
            }
            assert f"runs/rehearsal/global_step_{STEPS}/trainer_state.json" in keys
            assert any(k.endswith("model_world_size_1.index.json") for k in keys), sorted(keys)
            last_version = Path(reports[-1]["path"]).name
            assert f"runs/rehearsal/{last_version}/adapter_model.safetensors" in keys

            tracker.log({"trainer/global_step": STEPS, **mirror_metrics(mirror)}, STEPS)
            assert rh.query(prom, "mazerl_global_step", at_least=STEPS) == STEPS
            # Counted by the rank-0 process since the resume (Prometheus counters restart too).
            since = 1 + STEPS - resumed_at
            assert rh.query(prom, "mazerl_weight_sync_published", at_least=since) == since
            assert rh.query(prom, "mazerl_adapter_version") == versions[-1]
            rh.query(prom, "mazerl_reward_avg_raw_reward")
            rh.query(prom, "mazerl_policy_policy_loss")
            assert rh.query(prom, "mazerl_mirror_s3_uploaded", at_least=2) >= 2
            (tmp_path / "reports.json").write_text(json.dumps(reports, indent=1))
    finally:
        if tracker is not None:
            tracker.finish()
        if ray.is_initialized():
            ray.shutdown()
        for e in engines:
            e.terminate()
            e.wait(timeout=30)
        for n in nodes:
            n.kill()
        shutil.rmtree(ray_tmp, ignore_errors=True)
        mirror.close(timeout=0)
