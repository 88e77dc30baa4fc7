"""The SkyRL cluster path: SkyRL's own trainer on a Ray cluster with GPUs.

SkyRL does the work (FSDP policy, vLLM engines, LoRA synced through
``trainer.policy.model.lora.lora_sync_path`` on the shared filesystem); this module exports the
datasets from the ``mazes:`` section and registers the maze env inside the Ray task that runs
SkyRL's ``BasePPOExp``, as SkyRL's examples do for custom envs. ``maze-train --engine skyrl`` is
its command, in the GPU container image.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

from maze_engine.data import export_datasets
from maze_engine.errors import GpuImageRequiredError

if TYPE_CHECKING:
    from skyrl.train.config import SkyRLTrainConfig

    from maze_engine.config import MazerlConfig

GPU_MODULES = ("vllm",)
"""Importable only where ``skyrl[fsdp]`` is installed (the GPU container image)."""


def require_gpu_stack() -> None:
    """Raise :class:`GpuImageRequiredError` unless ``skyrl[fsdp]``'s GPU packages are importable."""
    missing = [m for m in GPU_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise GpuImageRequiredError(
            f"SkyRL training needs skyrl[fsdp] (vLLM, flash-attn, CUDA torch) and GPUs; "
            f"not installed here: {', '.join(missing)}. Run it in the mazerl GPU container image "
            "on the Ray cluster (maze-train --engine skyrl --submit ADDRESS). Here, --dry-run "
            "validates the config, and `maze-train --engine local` trains on CPU."
        )


def _train_in_ray_task(cfg: SkyRLTrainConfig) -> None:
    """Body of the Ray task: runs where SkyRL's generator creates envs, so register there."""
    from maze_verifier import register_env

    register_env(cfg.environment.env_class)
    # SkyRL's tensorboard logger reads this; keep the logs with the run on the shared FS.
    os.environ.setdefault("TENSORBOARD_DIR", str(Path(cfg.trainer.export_path) / "tensorboard"))
    from skyrl.train.entrypoints.main_base import BasePPOExp

    BasePPOExp(cfg).run()


def run_training(config: MazerlConfig, *, overwrite_data: bool = False) -> None:
    """Export the datasets, then run SkyRL's training main with the maze env.

    ``initialize_ray`` joins the job's cluster and sets SkyRL's runtime env and registries;
    ``BasePPOExp`` then runs in a Ray task (CPU 1, as SkyRL's ``skyrl_entrypoint``) that
    registers the env first. Blocks until training ends.
    """
    require_gpu_stack()
    export_datasets(config, overwrite=overwrite_data)
    import ray
    from skyrl.train.utils.utils import initialize_ray

    initialize_ray(config.skyrl)
    task = ray.remote(num_cpus=1)(_train_in_ray_task)
    ray.get(task.remote(config.skyrl))  # pyright: ignore[reportUnknownMemberType]
