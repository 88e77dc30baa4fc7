"""pytest fixtures for code built on maze-policy: one tiny Qwen3-VL per test session.

Import them into a ``conftest.py`` (``from maze_policy.testing import tiny_policy, ...``);
pytest is needed only where this module is imported.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from maze_policy.model import build_tiny_vlm, load_vlm
from maze_policy.policy import Policy


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> None:
    """One intra-op thread: on shared cores OpenMP oversubscription slows tiny forwards ~10x."""
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-VL checkpoint directory, built once per session (seed 0)."""
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny_vlm"), seed=0)


@pytest.fixture
def tiny_policy(tiny_vlm_dir: Path) -> Policy:
    """A fresh :class:`Policy` on the session's tiny model."""
    model, processor = load_vlm(tiny_vlm_dir)
    return Policy(model, processor)
