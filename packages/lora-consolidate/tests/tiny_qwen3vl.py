"""A tiny Qwen3-VL-architecture model with peft LoRA, built from a config (no downloads)."""

from __future__ import annotations

from typing import Any

import torch

LM_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
IMAGE_TOKEN_ID = 250


def tiny_config() -> Any:
    from transformers import Qwen3VLConfig

    return Qwen3VLConfig(
        text_config={
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "vocab_size": 256,
            "max_position_embeddings": 512,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [4, 2, 2],
                "mrope_interleaved": True,
            },
        },
        vision_config={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0, 1],
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        image_token_id=IMAGE_TOKEN_ID,
        video_token_id=251,
        vision_start_token_id=252,
        vision_end_token_id=253,
    )


def build_base(seed: int = 0) -> Any:
    from transformers import Qwen3VLForConditionalGeneration

    torch.manual_seed(seed)
    return Qwen3VLForConditionalGeneration(tiny_config()).eval()


def lora_config(*, include_vision: bool = False) -> Any:
    from peft import LoraConfig

    targets = [*LM_TARGETS, "qkv"] if include_vision else LM_TARGETS
    return LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=targets,
        exclude_modules=None if include_vision else r".*visual.*",
    )


def build_peft(seed: int = 0, *, include_vision: bool = False) -> Any:
    """Base model with LoRA whose B matrices are random, so the adapter changes the logits."""
    from peft import get_peft_model

    model = get_peft_model(build_base(seed), lora_config(include_vision=include_vision))
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
    return model.eval()


def sample_input_ids(seed: int = 0, length: int = 12) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 200, (2, length), generator=gen)
