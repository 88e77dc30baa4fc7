"""Local GRPO + LoRA engine for VLMs on visual mazes.

Modules: ``model`` (build/load Qwen-VL checkpoints), ``chat`` (multi-turn encoding with loss
masks), ``policy`` (sampling and log-probs), ``sft`` (oracle warm start), ``rollout`` (episodes
through the skyrl-gym ``maze`` env), ``grpo`` (SkyRL's losses), ``checkpoint`` (SkyRL layout),
``trainer`` (the loop, Ray workers), ``skyrl_cluster`` (SkyRL's own trainer on a GPU cluster).

Names below are imported on first use: torch, transformers and peft take tens of seconds to
import on a loaded 2-core box, and the config/launcher paths need none of them.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from maze_engine.chat import (
        Batch,
        ChatEncoder,
        ChatEncodingError,
        Trajectory,
        collate,
        decode_data_uri,
    )
    from maze_engine.model import (
        ModelLoadError,
        TinyVLMConfig,
        build_tiny_vlm,
        load_processor,
        load_vlm,
    )
    from maze_engine.policy import (
        Generation,
        Policy,
        SamplingParams,
        apply_lora,
        policy_logprobs,
        sequence_logprobs,
        suppressed_token_ids,
    )

__version__ = "0.1.0"

_EXPORTS = {
    "chat": (
        "Batch",
        "ChatEncoder",
        "ChatEncodingError",
        "Trajectory",
        "collate",
        "decode_data_uri",
    ),
    "model": ("ModelLoadError", "TinyVLMConfig", "build_tiny_vlm", "load_processor", "load_vlm"),
    "policy": (
        "Generation",
        "Policy",
        "SamplingParams",
        "apply_lora",
        "policy_logprobs",
        "sequence_logprobs",
        "suppressed_token_ids",
    ),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "Batch",
    "ChatEncoder",
    "ChatEncodingError",
    "Generation",
    "ModelLoadError",
    "Policy",
    "SamplingParams",
    "TinyVLMConfig",
    "Trajectory",
    "apply_lora",
    "build_tiny_vlm",
    "collate",
    "decode_data_uri",
    "load_processor",
    "load_vlm",
    "policy_logprobs",
    "sequence_logprobs",
    "suppressed_token_ids",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'maze_engine' has no attribute {name!r}")
    return getattr(import_module(f"maze_engine.{module}"), name)
