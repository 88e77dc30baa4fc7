"""LoRA adapters on the language model: the one place a peft ``LoraConfig`` is built."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from maze_policy.policy import Policy

if TYPE_CHECKING:
    from peft import LoraConfig

ALL_LINEAR = "all-linear"
"""peft's shorthand for every linear layer but the output head (SkyRL's default too)."""
VISION_TOWER = ".*visual.*"
"""Modules excluded by default: vLLM applies LoRA to the language model only."""


def lora_config(
    *,
    rank: int,
    alpha: int,
    dropout: float = 0.0,
    target_modules: str | Sequence[str] = ALL_LINEAR,
    exclude_modules: str | Sequence[str] | None = VISION_TOWER,
    init_lora_weights: bool = True,
) -> LoraConfig:
    """A peft ``LoraConfig`` in the terms SkyRL's ``trainer.policy.model.lora`` keys use.

    Args:
        rank: LoRA rank ``r``.
        alpha: LoRA scaling ``alpha``.
        dropout: Dropout on the LoRA input.
        target_modules: ``"all-linear"``, a regex, a comma-separated list or a list of names.
        exclude_modules: Regex or names kept frozen; the vision tower by default.
        init_lora_weights: peft's init; ``False`` gives random (non-zero) adapters for tests.

    Returns:
        The config to hand to :func:`apply_lora`.
    """
    from peft import LoraConfig

    target: str | list[str]
    if isinstance(target_modules, str):
        target = target_modules
        if target != ALL_LINEAR and "," in target:
            target = [t.strip() for t in target.split(",")]
    else:
        target = list(target_modules)
    extra: dict[str, Any] = {} if init_lora_weights else {"init_lora_weights": False}
    return LoraConfig(
        r=int(rank),
        lora_alpha=int(alpha),
        lora_dropout=float(dropout),
        target_modules=target,
        exclude_modules=exclude_modules
        if exclude_modules is None or isinstance(exclude_modules, str)
        else list(exclude_modules),
        **extra,
    )


def apply_lora(model: nn.Module, config: LoraConfig) -> nn.Module:
    """Wrap ``model`` with the LoRA adapter ``config`` describes (peft ``get_peft_model``)."""
    from peft import get_peft_model

    return cast(nn.Module, get_peft_model(cast(Any, model), config))


def load_policy(model_dir: str | Path, config: LoraConfig | None, threads: int) -> Policy:
    """Load a model directory as a :class:`Policy`, with a fresh LoRA adapter when ``config`` is set.

    Args:
        model_dir: A checkpoint directory :func:`maze_policy.model.load_vlm` reads.
        config: The adapter to add, or ``None`` for the bare model.
        threads: torch intra-op threads for this process (fixed so runs repeat bit for bit).
    """
    from maze_policy.model import load_vlm

    torch.set_num_threads(threads)
    model, processor = load_vlm(model_dir)
    if config is not None:
        model = apply_lora(model, config)
    return Policy(model, processor)
