"""Test helpers for code built on maze-engine: a warm-started tiny base, a local Ray head.

pytest is not needed to import this module; the helpers are plain functions a ``conftest.py``
wraps in fixtures of the scope it needs.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path

from maze_engine.lora_sync import HEAD_RESOURCE


def warm_started_base(root: Path, steps: int = 3) -> Path:
    """The smoke_5x5 base model after a ``steps``-step warm start, built under ``root``."""
    from maze_engine.config import load_config
    from maze_engine.trainer import base_model_dir, prepare_data

    config = load_config(
        "smoke_5x5",
        [
            f"trainer.export_path={root}",
            "trainer.eval_before_train=false",
            "mazes.train_size=8",
            f"local.warm_start.steps={steps}",
            "local.progress=false",
        ],
    )
    return base_model_dir(config, prepare_data(config), lambda _m: None)


@contextmanager
def local_ray_head(num_cpus: int = 2) -> Generator[None]:
    """A local Ray whose one node declares the head resource (as the cluster's CPU head)."""
    import ray
    from ray._private import ray_constants  # pyright: ignore[reportMissingTypeStubs]

    # Workers run this interpreter; under `uv run` Ray would otherwise ship the project.
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False
    ray.init(
        num_cpus=num_cpus,
        resources={HEAD_RESOURCE: 1},
        include_dashboard=False,
        log_to_driver=False,
    )
    try:
        yield
    finally:
        ray.shutdown()
