"""Shared fixtures for the model-side tests: one tiny Qwen3-VL built per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from maze_engine.model import build_tiny_vlm, load_vlm
from maze_engine.policy import Policy


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    # Two cores shared by several processes: one intra-op thread avoids OpenMP oversubscription,
    # which made tiny-model forwards ~10x slower in measurements here.
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny_vlm"), seed=0)


@pytest.fixture
def tiny_policy(tiny_vlm_dir: Path) -> Policy:
    model, processor = load_vlm(tiny_vlm_dir)
    return Policy(model, processor)
