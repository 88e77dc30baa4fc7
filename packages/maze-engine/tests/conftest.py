"""Shared fixtures: one tiny Qwen3-VL built per session (see maze_policy.testing), and one
warm-started smoke_5x5 base for the tests that train."""

from pathlib import Path

import pytest

from maze_policy.testing import one_torch_thread, tiny_policy, tiny_vlm_dir

__all__ = ["base_model", "one_torch_thread", "tiny_policy", "tiny_vlm_dir"]


@pytest.fixture(scope="session")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A smoke_5x5 base after a 3-step warm start, built once for the engine's run tests."""
    from maze_engine.testing import warm_started_base

    return warm_started_base(tmp_path_factory.mktemp("base"))
