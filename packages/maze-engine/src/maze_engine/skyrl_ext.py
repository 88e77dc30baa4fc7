"""This project's sync, consolidation, S3 mirror and metrics in SkyRL's own extension points.

Nothing in SkyRL is patched; each piece is a subclass SkyRL's entrypoint hooks hand back:

- :class:`MazePPOExp` (``BasePPOExp``): ``get_trainer`` returns :class:`MazeTrainer`,
  ``get_tracker`` returns :class:`PrometheusTracking`.
- :class:`MazeTrainer` (``RayPPOTrainer``): ``build_models`` swaps SkyRL's FSDP policy worker
  for :func:`policy_worker_class`'s subclass; ``save_checkpoints`` hands each finished
  checkpoint (and the published adapters) to the S3 :class:`weight_sync.BackgroundMirror`.
- the policy worker (``FSDPPolicyWorkerBase``) overrides ``_save_lora_adapters_and_sync``, the
  method SkyRL's LoRA weight sync calls on every rank after each update, and ``save_hf_model``
  (``hf_save_interval``): both go through :class:`maze_engine.lora_sync.ShardedLoraSync`; and
  ``save_checkpoint`` / ``load_checkpoint``: beside SkyRL's rank files each checkpoint holds the
  LoRA and optimizer state as shards, which a job on another world size resumes from.
- :class:`PrometheusTracking` (``Tracking``): SkyRL's metrics under the local engine's
  Prometheus names (:func:`maze_engine.metrics.prometheus_name`), plus ``weight_sync/*`` and
  ``mirror/*``.

SkyRL's FSDP worker module imports flash-attn, so the worker subclass is built on first use in
the GPU image; everything else here imports wherever ``skyrl`` does.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl.backends.skyrl_train.inference_servers.remote_inference_client import (
    SKYRL_LORA_ADAPTER_NAME,
)
from skyrl.train.entrypoints.main_base import BasePPOExp
from skyrl.train.trainer import RayPPOTrainer
from skyrl.train.utils.tracking import Tracking

from maze_engine.lora_sync import (
    ShardedLoraSync,
    SyncLayout,
    SyncSettings,
    has_lora_state,
    load_lora_state,
    peft_adapter_config,
    read_sync_status,
    save_lora_state,
)
from maze_engine.metrics import MetricsSink, mirror_metrics
from weight_sync import AdapterStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterSettings:
    """The project's own settings of the cluster run (from the config's ``cluster:`` section)."""

    sync: SyncSettings
    s3_uri: str | None = None
    """``s3://bucket/prefix`` the checkpoints and published adapters are mirrored to."""
    prometheus_port: int | None = None
    prometheus_host: str = "0.0.0.0"  # scraped from other pods


class PrometheusTracking(Tracking):
    """SkyRL's tracker, also exporting every scalar it logs to Prometheus."""

    def __init__(
        self,
        *args: Any,
        sync_root: str | None = None,
        prometheus_port: int | None = None,
        prometheus_host: str = "127.0.0.1",
        extra: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.sync_root = sync_root
        self.extra = extra
        """Callable returning more scalars to export with each log (the S3 mirror's)."""
        self.sink = MetricsSink(prometheus_port=prometheus_port, prometheus_host=prometheus_host)

    def log(self, data: Any, step: Any, commit: bool = False) -> None:
        super().log(data, step, commit=commit)
        scalars = {
            str(k): float(v)
            for k, v in dict(data).items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if self.sync_root is not None:
            scalars.update(read_sync_status(self.sync_root))
        if self.extra is not None:
            scalars.update(self.extra())
        self.sink.log(int(step), scalars)

    def finish(self) -> None:
        super().finish()
        self.sink.close()


def _worker_body(base: type[Any], settings: SyncSettings) -> type[Any]:
    """SkyRL's FSDP policy worker with LoRA sync and export through shards and the head node."""

    class MazeFSDPPolicyWorker(base):  # type: ignore[misc, valid-type]
        maze_sync_settings = settings

        def _maze_sync(self) -> ShardedLoraSync:
            sync = getattr(self, "_maze_lora_sync", None)
            if sync is None:
                sync = ShardedLoraSync(self.maze_sync_settings)
                self._maze_lora_sync = sync
            return sync

        def _maze_state(self) -> tuple[Any, dict[str, Any]]:
            import torch.distributed as dist

            if getattr(self, "_is_multimodal_lm_only", False):
                # SkyRL renames such adapters' keys into vLLM's multimodal namespace first.
                raise NotImplementedError(
                    "maze-engine's LoRA sync needs the full VLM as the policy "
                    "(trainer.policy.model.path a *ForConditionalGeneration checkpoint)"
                )
            peft_model = getattr(self.model.model, "_fsdp_wrapped_module", self.model.model)
            return dist, peft_adapter_config(peft_model)

        async def _save_lora_adapters_and_sync(
            self,
            peft_model: Any,
            lora_sync_path: str,
            inference_engine_client: Any,
            lora_name: str = "",
        ) -> None:
            dist, config = self._maze_state()
            await self._maze_sync().sync(
                self.model.model.state_dict(),
                config,
                rank=dist.get_rank(),
                world_size=dist.get_world_size(),
                client=inference_engine_client,
                lora_name=lora_name or SKYRL_LORA_ADAPTER_NAME,
                barrier=dist.barrier,
            )

        def save_checkpoint(self, ckpt_dir: str, tokenizer: Any = None) -> None:
            super().save_checkpoint(ckpt_dir, tokenizer)
            if self._is_lora:  # also readable at any world size (a replaced node, fewer GPUs)
                import torch.distributed as dist

                save_lora_state(
                    ckpt_dir,
                    self.model.model,
                    self.optimizer,
                    rank=dist.get_rank(),
                    world_size=dist.get_world_size(),
                    barrier=dist.barrier,
                )

        def load_checkpoint(
            self,
            ckpt_dir: str,
            load_optimizer_states: bool = True,
            load_lr_scheduler_states: bool = True,
        ) -> Any:
            import torch.distributed as dist

            world = dist.get_world_size()
            own = Path(ckpt_dir) / f"model_world_size_{world}_rank_{dist.get_rank()}.pt"
            if own.exists() or not self._is_lora or not has_lora_state(ckpt_dir):
                parent: Any = super()
                return parent.load_checkpoint(
                    ckpt_dir, load_optimizer_states, load_lr_scheduler_states
                )
            return self._maze_load_other_world(
                ckpt_dir, load_optimizer_states, load_lr_scheduler_states
            )

        def _maze_load_other_world(
            self, ckpt_dir: str, load_optimizer_states: bool, load_lr_scheduler_states: bool
        ) -> dict[str, Any]:
            """Resume a checkpoint saved at another world size.

            LoRA and optimizer state come from the shards, the scheduler (replicated) from
            rank 0's extra state.
            """
            import torch
            import torch.distributed as dist

            load_lora_state(
                ckpt_dir, self.model.model, self.optimizer if load_optimizer_states else None
            )
            extras = sorted(Path(ckpt_dir).glob("extra_state_world_size_*_rank_0.pt"))
            extra: dict[str, Any] = (
                torch.load(extras[0], map_location="cpu", weights_only=False) if extras else {}
            )
            if load_lr_scheduler_states and self.scheduler is not None and "lr_scheduler" in extra:
                self.scheduler.load_state_dict(extra["lr_scheduler"])
            dist.barrier()
            log.info(
                "resumed LoRA and optimizer state from %s at world size %d",
                ckpt_dir,
                dist.get_world_size(),
            )
            return {
                "client_state": extra.get("client_state", {}),
                "tag": extra.get("tag"),
                "fsdp_strategy": extra.get("fsdp_strategy"),
                "world_size": dist.get_world_size(),
                "rank": dist.get_rank(),
            }

        def save_hf_model(self, export_dir: str, tokenizer: Any) -> None:
            if not self._is_lora:
                super().save_hf_model(export_dir, tokenizer)
                return
            dist, config = self._maze_state()
            self._maze_sync().export(
                self.model.model.state_dict(),
                config,
                export_dir,
                rank=dist.get_rank(),
                world_size=dist.get_world_size(),
                barrier=dist.barrier,
            )

    return MazeFSDPPolicyWorker


def policy_worker_class(settings: SyncSettings) -> Any:
    """The Ray actor class of the maze policy worker (GPU image only: imports flash-attn)."""
    import ray
    from skyrl.backends.skyrl_train.workers.fsdp.fsdp_worker import FSDPPolicyWorkerBase

    return ray.remote(num_gpus=1)(_worker_body(FSDPPolicyWorkerBase, settings))


class MazeTrainer(RayPPOTrainer):
    """SkyRL's trainer with the maze policy worker and the S3 mirror."""

    maze_settings: ClusterSettings
    mirror: Any = None

    def build_models(self, PolicyWorker: Any, CriticWorker: Any, RefWorker: Any) -> None:  # noqa: N803
        if self.cfg.trainer.strategy != "fsdp":
            raise NotImplementedError("maze-engine's cluster path runs SkyRL's FSDP strategy")
        super().build_models(policy_worker_class(self.maze_settings.sync), CriticWorker, RefWorker)

    def save_checkpoints(self) -> str:
        folder = super().save_checkpoints()
        if self.mirror is not None:
            # Complete on the shared filesystem (SkyRL wrote its pointer last): safe to copy.
            self.mirror.submit(Path(folder))
            latest = AdapterStore(SyncLayout(Path(self.maze_settings.sync.root)).store_root).latest(
                verify=False
            )
            if latest is not None:  # the adapter the engines serve at this checkpoint
                self.mirror.submit(latest.path)
        return folder


class MazePPOExp(BasePPOExp):
    """SkyRL's PPO experiment with this project's trainer and tracker."""

    def __init__(self, cfg: Any, settings: ClusterSettings) -> None:
        self.maze_settings = settings
        self.mirror = None
        if settings.s3_uri is not None:
            from weight_sync import BackgroundMirror

            self.mirror = BackgroundMirror(settings.s3_uri)
        super().__init__(cfg)

    def mirror_metrics(self) -> dict[str, float]:
        return mirror_metrics(self.mirror)

    def get_tracker(self) -> Tracking:
        t = self.cfg.trainer
        return PrometheusTracking(
            project_name=t.project_name,
            experiment_name=t.run_name,
            backend=t.logger,
            config=self.cfg,
            tags=t.tags,
            sync_root=self.maze_settings.sync.root,
            prometheus_port=self.maze_settings.prometheus_port,
            prometheus_host=self.maze_settings.prometheus_host,
            extra=self.mirror_metrics,
        )

    def get_trainer(self, *args: Any, **kwargs: Any) -> RayPPOTrainer:
        trainer = MazeTrainer(*args, **kwargs)
        trainer.maze_settings = self.maze_settings
        trainer.mirror = self.mirror
        return trainer

    def run(self) -> None:
        try:
            super().run()
        finally:
            if self.mirror is not None:
                asyncio.run(asyncio.to_thread(self.mirror.close))
