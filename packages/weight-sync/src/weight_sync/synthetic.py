"""Generated PEFT LoRA adapters (random bf16 weights) for tests and benchmarks.

No model download: shapes come from a small config. ``qwen3_vl_8b()`` matches the language
model of Qwen3-VL-8B (36 layers, hidden 4096, MLP 12288, 8 KV heads of 128); rank 32 on all
seven projections gives about 87M parameters, ~175 MB in bf16.
"""

from __future__ import annotations

import json
import os
import random
import struct
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LoraShape:
    """Dimensions of a LoRA adapter on all seven attention and MLP projections of every layer."""

    num_layers: int
    hidden: int
    intermediate: int
    kv_dim: int
    rank: int
    base_model: str = "synthetic"

    def modules(self) -> list[tuple[str, int, int]]:
        """(name, in_features, out_features) of every adapted projection in one layer."""
        h, i, kv = self.hidden, self.intermediate, self.kv_dim
        return [
            ("self_attn.q_proj", h, h),
            ("self_attn.k_proj", h, kv),
            ("self_attn.v_proj", h, kv),
            ("self_attn.o_proj", h, h),
            ("mlp.gate_proj", h, i),
            ("mlp.up_proj", h, i),
            ("mlp.down_proj", i, h),
        ]

    @property
    def num_params(self) -> int:
        per_layer = sum(self.rank * (fi + fo) for _, fi, fo in self.modules())
        return per_layer * self.num_layers


def qwen3_vl_8b(rank: int = 32) -> LoraShape:
    """The LoRA shape of Qwen3-VL-8B's language model at ``rank``."""
    return LoraShape(36, 4096, 12288, 1024, rank, base_model="Qwen/Qwen3-VL-8B-Instruct")


def tiny(rank: int = 4, num_layers: int = 2, hidden: int = 64) -> LoraShape:
    """A small LoRA shape for fast tests."""
    return LoraShape(num_layers, hidden, hidden * 2, hidden // 2, rank)


def adapter_files(shape: LoraShape, seed: int) -> dict[str, bytes]:
    """``{file name: bytes}`` of a PEFT adapter; deterministic in ``(shape, seed)``."""
    rng = random.Random(seed)
    header: dict[str, object] = {"__metadata__": {"format": "pt", "seed": str(seed)}}
    offset = 0
    tensors: list[tuple[str, list[int]]] = []
    for layer in range(shape.num_layers):
        prefix = f"base_model.model.model.language_model.layers.{layer}"
        for name, fin, fout in shape.modules():
            tensors.append((f"{prefix}.{name}.lora_A.weight", [shape.rank, fin]))
            tensors.append((f"{prefix}.{name}.lora_B.weight", [fout, shape.rank]))
    for name, dims in tensors:
        nbytes = dims[0] * dims[1] * 2
        header[name] = {"dtype": "BF16", "shape": dims, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes
    weights = struct.pack("<Q", len(raw)) + raw + rng.randbytes(offset)
    config = {
        "peft_type": "LORA",
        "base_model_name_or_path": shape.base_model,
        "r": shape.rank,
        "lora_alpha": 2 * shape.rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "task_type": "CAUSAL_LM",
        "target_modules": sorted({n.split(".")[-1] for n, _, _ in shape.modules()}),
        "seed": seed,
    }
    return {
        "adapter_config.json": (json.dumps(config, indent=2) + "\n").encode(),
        "adapter_model.safetensors": weights,
    }


def write_adapter(dest: str | os.PathLike[str], shape: LoraShape, seed: int) -> Path:
    """Write a generated adapter into directory ``dest`` (created if needed)."""
    path = Path(dest)
    path.mkdir(parents=True, exist_ok=True)
    for name, data in adapter_files(shape, seed).items():
        (path / name).write_bytes(data)
    return path
