"""Rollout workers: the same class runs in-process or as a Ray actor.

A worker owns a copy of the base model and the current LoRA adapter. Adapters arrive through
weight-sync exactly as vLLM engines on the cluster get them: the learner publishes a version to
the shared ``lora_sync_path`` and the worker loads that verified version from disk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from maze_engine.errors import AdapterLoadError
from maze_policy.chat import Trajectory
from maze_policy.lora import load_policy, lora_config
from maze_policy.rollout import Episode, run_episodes
from maze_policy.sampling import SamplingParams

if TYPE_CHECKING:
    from peft import LoraConfig
    from skyrl.train.config import SkyRLLoraConfig


def lora_config_from_skyrl(lora: SkyRLLoraConfig) -> LoraConfig:
    """The peft ``LoraConfig`` that SkyRL's ``trainer.policy.model.lora`` keys describe."""
    return lora_config(
        rank=lora.rank,
        alpha=lora.alpha,
        dropout=lora.dropout,
        target_modules=lora.target_modules,
        exclude_modules=lora.exclude_modules,
    )


class RolloutWorker:
    """Plays rollouts with its own base model plus the adapter version it last loaded."""

    def __init__(self, model_dir: str, lora_cfg: LoraConfig, threads: int, sync_root: str) -> None:
        self.policy = load_policy(model_dir, lora_cfg, threads)
        self.sync_root = sync_root
        self.version: int | None = None

    def load_adapter(self, version: int) -> int:
        """Load a published, verified adapter version; returns the version now active."""
        if version == self.version:
            return version
        from peft import set_peft_model_state_dict  # pyright: ignore[reportUnknownVariableType]
        from safetensors.torch import load_file  # pyright: ignore[reportUnknownVariableType]

        from weight_sync import AdapterStore

        store = AdapterStore(Path(self.sync_root))
        published = store.get(version)  # verifies every file against the manifest
        weights = load_file(str(published.path / "adapter_model.safetensors"))
        result = set_peft_model_state_dict(cast(Any, self.policy.model), weights)
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        if unexpected:
            raise AdapterLoadError(
                f"adapter v{version} has keys this model lacks: {unexpected[:3]}"
            )
        self.version = version
        return version

    def rollout(
        self,
        rows: Sequence[Mapping[str, Any]],
        row_indices: Sequence[int],
        groups: Sequence[int],
        sampling: SamplingParams,
        seed: int,
        *,
        max_turns: int | None = None,
        outcomes_only: bool = False,
    ) -> list[Episode]:
        """Play the rows; ``outcomes_only`` drops each trajectory (evaluation reads outcomes).

        What goes back to the learner is only what it reads: the PIL frames are dropped (the
        update uses the pixel values), and with ``outcomes_only`` the tokens and pixel values
        too, which for an eval of 64 mazes are about a GB of float32 patches.
        """
        episodes = run_episodes(
            self.policy,
            rows,
            sampling=sampling,
            seed=seed,
            row_indices=row_indices,
            groups=groups,
            max_turns=max_turns,
        )
        for ep in episodes:
            if outcomes_only:
                ep.trajectory = Trajectory()
            else:
                ep.trajectory.images = []
        return episodes
