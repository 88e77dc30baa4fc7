"""Merge a PEFT LoRA adapter into base safetensors weights, one base tensor at a time:
``W' = W + scale * B @ A`` (computed in float32, cast back to W's dtype)."""

from __future__ import annotations

import json
import math
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import safe_open

from lora_consolidate import keys
from lora_consolidate._atomic import staged_directory
from lora_consolidate._safetensors_stream import TensorSpec, write_streaming
from lora_consolidate.consolidate import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from lora_consolidate.errors import ConsolidationError, ShardError

_ST_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


def _open(path: Path) -> Any:
    # safetensors ships no type information for safe_open's handle.
    return safe_open(str(path), "pt")


@dataclass(frozen=True)
class MergeResult:
    out: Path
    merged_modules: int
    files: int
    seconds: float


def _pattern_value(patterns: dict[str, Any], module: str, default: Any) -> Any:
    # PEFT's rule: a pattern key matches a module path that ends with it at a dot boundary.
    for pattern, value in patterns.items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            return value
    return default


def _base_files(base_dir: Path) -> list[str]:
    index = base_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise ShardError(index, f"cannot read safetensors index ({exc})") from exc
        return sorted(set(weight_map.values()))
    if (base_dir / "model.safetensors").is_file():
        return ["model.safetensors"]
    raise ConsolidationError(
        f"{base_dir}: no model.safetensors or model.safetensors.index.json (only safetensors "
        "base checkpoints are supported)"
    )


def merge_adapter(
    adapter_dir: Path | str,
    base_dir: Path | str,
    out: Path | str,
    *,
    overwrite: bool = False,
) -> MergeResult:
    """Write a full model directory: ``base_dir`` with the adapter's deltas folded in.

    Non-weight files (config, generation config, tokenizer, index) are copied unchanged. Every
    adapted module must exist in the base checkpoint, else nothing is written.
    """
    started = time.perf_counter()
    adapter_dir, base_dir, out = Path(adapter_dir), Path(base_dir), Path(out)
    config_file = adapter_dir / ADAPTER_CONFIG
    try:
        config: dict[str, Any] = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ShardError(config_file, f"cannot read adapter config ({exc})") from exc
    if config.get("use_dora"):
        raise ConsolidationError(f"{config_file}: merging DoRA adapters is not supported")
    if config.get("fan_in_fan_out"):
        raise ConsolidationError(f"{config_file}: fan_in_fan_out adapters are not supported")
    r_default = int(config["r"])
    alpha_default = float(config["lora_alpha"])
    rank_pattern: dict[str, Any] = config.get("rank_pattern") or {}
    alpha_pattern: dict[str, Any] = config.get("alpha_pattern") or {}
    rslora = bool(config.get("use_rslora"))

    weights_file = adapter_dir / ADAPTER_WEIGHTS
    lora: dict[str, dict[str, torch.Tensor]] = {}
    try:
        with _open(weights_file) as f:
            for name in cast(list[str], f.keys()):
                part = "A" if ".lora_A." in name else "B" if ".lora_B." in name else None
                if part is None or not name.endswith(".weight"):
                    raise ShardError(weights_file, "only linear lora_A/lora_B merge", key=name)
                lora.setdefault(keys.module_path(name), {})[part] = f.get_tensor(name)
    except ConsolidationError:
        raise
    except Exception as exc:
        raise ShardError(weights_file, f"cannot read adapter weights ({exc})") from exc

    deltas: dict[str, tuple[torch.Tensor, torch.Tensor, float]] = {}
    for module, parts in lora.items():
        if set(parts) != {"A", "B"}:
            raise ShardError(weights_file, "lora_A/lora_B pair incomplete", key=module)
        r = int(_pattern_value(rank_pattern, module, r_default))
        alpha = float(_pattern_value(alpha_pattern, module, alpha_default))
        if parts["A"].shape[0] != r:
            raise ShardError(
                weights_file, f"lora_A rank {parts['A'].shape[0]} but config says {r}", key=module
            )
        scale = alpha / (math.sqrt(r) if rslora else r)
        deltas[f"{module}.weight"] = (parts["A"], parts["B"], scale)

    files = _base_files(base_dir)
    pending = set(deltas)
    plans: list[tuple[str, list[TensorSpec]]] = []
    for file in files:
        path = base_dir / file
        specs: list[TensorSpec] = []
        try:
            with _open(path) as f:
                for name in cast(list[str], f.keys()):
                    sl: Any = f.get_slice(name)
                    dtype = _ST_DTYPES[sl.get_dtype()]
                    specs.append(TensorSpec(name, tuple(sl.get_shape()), dtype))
        except Exception as exc:
            raise ShardError(path, f"cannot read base weights ({exc})") from exc
        for spec in specs:
            if spec.name in deltas:
                a, b, _ = deltas[spec.name]
                if spec.shape != (b.shape[0], a.shape[1]):
                    raise ShardError(
                        path,
                        f"base weight {list(spec.shape)} does not match LoRA "
                        f"B{list(b.shape)} @ A{list(a.shape)}",
                        key=spec.name,
                    )
                pending.discard(spec.name)
        plans.append((file, specs))
    if pending:
        first = sorted(pending)[0]
        raise ShardError(base_dir, "adapted module has no weight in the base checkpoint", key=first)

    with staged_directory(out, overwrite=overwrite) as staging:
        for item in base_dir.iterdir():
            if item.name in files:
                continue
            if item.is_dir():
                shutil.copytree(item, staging / item.name)
            else:
                shutil.copy2(item, staging / item.name)
        for file, specs in plans:
            with _open(base_dir / file) as f:

                def produce(spec: TensorSpec, f: Any = f) -> torch.Tensor:
                    weight: torch.Tensor = f.get_tensor(spec.name)
                    if spec.name not in deltas:
                        return weight
                    a, b, scale = deltas[spec.name]
                    merged = weight.float() + scale * (b.float() @ a.float())
                    return merged.to(weight.dtype)

                write_streaming(staging / file, specs, produce, metadata={"format": "pt"})
    return MergeResult(out, len(deltas), len(files), time.perf_counter() - started)
