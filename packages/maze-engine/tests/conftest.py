"""Shared fixtures: one tiny Qwen3-VL built per session (see maze_policy.testing), and one
warm-started tiny_local base for the tests that train."""

from pathlib import Path

import pytest

from maze_policy.testing import one_torch_thread, tiny_policy, tiny_vlm_dir

__all__ = ["base_model", "one_torch_thread", "tiny_policy", "tiny_vlm_dir"]


@pytest.fixture(scope="session")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny_local base after a 3-step warm start, built once for the engine's run tests."""
    from maze_engine.config import load_config
    from maze_engine.trainer import base_model_dir, prepare_data

    root = tmp_path_factory.mktemp("base")
    config = load_config(
        "tiny_local",
        [
            f"trainer.export_path={root}",
            "trainer.eval_before_train=false",
            "mazes.train_size=8",
            "local.warm_start.steps=3",
            "local.progress=false",
        ],
    )
    return base_model_dir(config, prepare_data(config), lambda _m: None)
