"""Rollout workers: the same class runs in-process or as a Ray actor.

A worker owns a copy of the base model and the current LoRA adapter. Adapters arrive through
weight-sync exactly as vLLM engines on the cluster get them: the learner publishes a version to
the shared ``lora_sync_path`` and the worker loads that verified version from disk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import torch

from maze_engine.policy import Policy, SamplingParams
from maze_engine.rollout import Episode, run_episodes


def lora_config_from_skyrl(lora: Any) -> Any:
    """A peft ``LoraConfig`` from SkyRL's ``trainer.policy.model.lora`` keys."""
    from peft import LoraConfig

    target = lora.target_modules
    if isinstance(target, str) and target != "all-linear" and "," in target:
        target = [t.strip() for t in target.split(",")]
    return LoraConfig(
        r=int(lora.rank),
        lora_alpha=int(lora.alpha),
        lora_dropout=float(lora.dropout),
        target_modules=target,
        exclude_modules=lora.exclude_modules,
    )


def load_policy(model_dir: str | Path, lora_cfg: Any, threads: int) -> Policy:
    from peft import get_peft_model

    from maze_engine.model import load_vlm

    torch.set_num_threads(threads)
    model, processor = load_vlm(model_dir)
    peft_model = get_peft_model(cast(Any, model), lora_cfg)
    return Policy(cast(torch.nn.Module, peft_model), processor)


class RolloutWorker:
    def __init__(self, model_dir: str, lora_cfg: Any, threads: int, sync_root: str) -> None:
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
            raise RuntimeError(f"adapter v{version} has keys this model lacks: {unexpected[:3]}")
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
    ) -> list[Episode]:
        return run_episodes(
            self.policy,
            rows,
            sampling=sampling,
            seed=seed,
            row_indices=row_indices,
            groups=groups,
            max_turns=max_turns,
        )
