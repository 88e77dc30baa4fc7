"""End to end: train briefly, publish the adapter, the server hot-loads it from weight-sync, and
maze-eval scores it through the server's HTTP API with the same solve rate as in-process, in the
whole conversation and in the per-turn contexts latest and route (trained, served and scored in
each)."""

import time
from pathlib import Path
from typing import Any

import httpx
import pytest


@pytest.fixture(scope="module", params=["full", "latest", "route"])
def trained(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str]:
    """A run directory and the context its policy trained in."""
    from maze_engine.config import load_config
    from maze_engine.trainer import train

    run = tmp_path_factory.mktemp(f"run-{request.param}")
    config = load_config(
        "smoke_5x5",
        [
            f"trainer.export_path={run}",
            "trainer.max_training_steps=2",
            "trainer.train_batch_size=2",
            "trainer.policy_mini_batch_size=2",
            "generator.n_samples_per_prompt=2",
            "generator.sampling_params.max_generate_length=16",
            "trainer.ckpt_interval=2",
            "trainer.eval_interval=0",
            "trainer.eval_before_train=false",
            "local.warm_start.steps=20",
            "local.rollout_workers=0",
            "mazes.train_size=8",
            "local.progress=false",
            "local.tensorboard=false",
            "mazes.reward_spec=visgym_sft",
            f"local.context={request.param}",
        ],
    )
    train(config, say=lambda _m: None)
    return run, request.param


def _play(backend: Any) -> Any:
    from maze_evaluation import evaluate

    # Same eval set, images (32 px per square) and budgets (slack 2) as the training run.
    return evaluate(
        backend, eval_set="tiny-64", limit=8, cell_px=32, slack=2, max_new_tokens=24, progress=False
    )


def test_server_hot_loads_trained_adapter_and_eval_over_http_matches_in_process(
    trained: tuple[Path, str],
) -> None:
    from maze_evaluation import EndpointBackend, episode_differences, summarize
    from maze_evaluation.local import LocalBackend
    from maze_policy.contexts import read_context
    from maze_serving.app import create_app
    from maze_serving.engine import EngineConfig
    from maze_serving.server import serve_in_thread
    from weight_sync import AdapterStore

    run, context = trained
    base = run / "base_model"
    store = AdapterStore(run / "lora_sync")
    latest = store.latest()
    assert latest is not None and latest.step == 2
    # The published adapter says its context: maze-serve and maze-eval answer in it by default.
    assert read_context(latest.path) == context
    app = create_app(
        EngineConfig(
            model_path=str(base),
            watch_dir=str(store.root),
            watch_poll_s=0.2,
            threads=1,
            context=context,
        )
    )
    with serve_in_thread(app, wait_model=True, startup_timeout=120) as url:
        name = f"{base.name}:latest"
        deadline = time.monotonic() + 60
        models: set[str] = set()
        while name not in models and time.monotonic() < deadline:
            models = {m["id"] for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]}
            time.sleep(0.2)
        assert name in models, models
        over_http = _play(EndpointBackend(url, name, concurrency=1, context=context))
    in_process = _play(LocalBackend(base, latest.path, batch_size=1, threads=1, context=context))
    a, b = summarize(over_http), summarize(in_process)
    assert a.episodes == b.episodes == 8
    assert a.solve_rate == b.solve_rate
    # Greedy decoding of the same weights: every episode plays out the same, reply for reply.
    assert episode_differences(over_http, in_process) == []
