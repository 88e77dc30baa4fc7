"""The SkyRL cluster path: SkyRL's own trainer on a Ray cluster with GPUs.

SkyRL does the work (FSDP policy, vLLM engines); this module exports the datasets from the
``mazes:`` section, registers the maze env inside the Ray task that runs the experiment (as
SkyRL's examples do for custom envs) and runs :class:`maze_engine.skyrl_ext.MazePPOExp`: SkyRL's
``BasePPOExp`` with this project's LoRA sync (shards, head-node consolidation, weight-sync
versions), S3 mirror and Prometheus metrics plugged into its hooks. ``maze-train --engine
skyrl`` is its command, in the GPU container image.
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
    from maze_engine.skyrl_ext import ClusterSettings

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


def cluster_settings(config: MazerlConfig) -> ClusterSettings:
    """The ``cluster:`` section (and the run's rendering) as the SkyRL hooks take it."""
    from maze_engine.lora_sync import SyncSettings
    from maze_engine.skyrl_ext import ClusterSettings

    c = config.cluster
    return ClusterSettings(
        sync=SyncSettings(
            root=str(config.skyrl.trainer.policy.model.lora.lora_sync_path),
            head_resource=c.head_resource,
            keep=c.keep_versions,
            cell_px=config.mazes.cell_px,
            retries=c.handover_retries,
        ),
        s3_uri=c.s3_uri,
        prometheus_port=c.prometheus_port,
    )


def _train_in_ray_task(cfg: SkyRLTrainConfig, settings: ClusterSettings) -> None:
    """Body of the Ray task: runs where SkyRL's generator creates envs, so register there."""
    from maze_verifier import register_env

    register_env(cfg.environment.env_class)
    # SkyRL's tensorboard logger reads this; keep the logs with the run on the shared FS.
    os.environ.setdefault("TENSORBOARD_DIR", str(Path(cfg.trainer.export_path) / "tensorboard"))
    from maze_engine.skyrl_ext import MazePPOExp

    MazePPOExp(cfg, settings).run()


def run_training(config: MazerlConfig, *, overwrite_data: bool = False) -> None:
    """Export the datasets, then run SkyRL's training main with the maze env.

    ``initialize_ray`` joins the job's cluster and sets SkyRL's runtime env and registries; the
    head node's resource is checked; ``MazePPOExp`` then runs in a Ray task (CPU 1, as SkyRL's
    ``skyrl_entrypoint``) that registers the env first. Blocks until training ends.

    Raises:
        HeadNodeMissingError: No node declares ``cluster.head_resource``.
    """
    require_gpu_stack()
    export_datasets(config, overwrite=overwrite_data)
    import ray
    from skyrl.train.utils.utils import initialize_ray

    from maze_engine.lora_sync import require_head_node

    initialize_ray(config.skyrl)
    settings = cluster_settings(config)
    require_head_node(settings.sync.head_resource)  # before any GPU is taken
    task = ray.remote(num_cpus=1)(_train_in_ray_task)
    ray.get(task.remote(config.skyrl, settings))  # pyright: ignore[reportUnknownMemberType]
