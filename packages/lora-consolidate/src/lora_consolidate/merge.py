"""Merge a PEFT LoRA adapter into base safetensors weights, one base tensor at a time.

Each adapted weight becomes ``W' = W + scale * B @ A`` (computed in float32, cast back to W's
dtype).
"""

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
from lora_consolidate._safetensors_stream import DTYPES_BY_NAME, TensorSpec, write_streaming
from lora_consolidate.consolidate import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from lora_consolidate.errors import ConsolidationError, ShardError


def _open(path: Path) -> Any:
    # safetensors ships no type information for safe_open's handle.
    return safe_open(str(path), "pt")


@dataclass(frozen=True)
class MergeResult:
    """What :func:`merge_adapter` wrote: output directory, modules merged, base files, seconds."""

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


_Delta = tuple[torch.Tensor, torch.Tensor, float]
"""``(lora_A, lora_B, scale)`` of one adapted base weight."""

_Plan = list[tuple[str, list[TensorSpec]]]
"""Each base safetensors file with the specs of the tensors it holds, in file order."""


@dataclass(frozen=True)
class _Scaling:
    """What an adapter config says about ranks and alphas, per module."""

    r: int
    alpha: float
    rank_pattern: dict[str, Any]
    alpha_pattern: dict[str, Any]
    rslora: bool

    def scale(self, module: str, rank: int, where: Path) -> float:
        r = int(_pattern_value(self.rank_pattern, module, self.r))
        alpha = float(_pattern_value(self.alpha_pattern, module, self.alpha))
        if rank != r:
            raise ShardError(where, f"lora_A rank {rank} but config says {r}", key=module)
        return alpha / (math.sqrt(r) if self.rslora else r)


def _read_scaling(config_file: Path) -> _Scaling:
    try:
        config: dict[str, Any] = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ShardError(config_file, f"cannot read adapter config ({exc})") from exc
    if config.get("use_dora"):
        raise ConsolidationError(f"{config_file}: merging DoRA adapters is not supported")
    if config.get("fan_in_fan_out"):
        raise ConsolidationError(f"{config_file}: fan_in_fan_out adapters are not supported")
    return _Scaling(
        r=int(config["r"]),
        alpha=float(config["lora_alpha"]),
        rank_pattern=config.get("rank_pattern") or {},
        alpha_pattern=config.get("alpha_pattern") or {},
        rslora=bool(config.get("use_rslora")),
    )


def _read_lora(weights_file: Path) -> dict[str, dict[str, torch.Tensor]]:
    """``{module path: {"A": lora_A, "B": lora_B}}`` of a PEFT adapter's weights."""
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
    return lora


def _deltas(
    lora: dict[str, dict[str, torch.Tensor]], scaling: _Scaling, weights_file: Path
) -> dict[str, _Delta]:
    """The delta of every adapted module, keyed by the base weight it applies to."""
    deltas: dict[str, _Delta] = {}
    for module, parts in lora.items():
        if set(parts) != {"A", "B"}:
            raise ShardError(weights_file, "lora_A/lora_B pair incomplete", key=module)
        scale = scaling.scale(module, parts["A"].shape[0], weights_file)
        deltas[f"{module}.weight"] = (parts["A"], parts["B"], scale)
    return deltas


def _read_specs(path: Path) -> list[TensorSpec]:
    specs: list[TensorSpec] = []
    try:
        with _open(path) as f:
            for name in cast(list[str], f.keys()):
                sl: Any = f.get_slice(name)
                specs.append(
                    TensorSpec(name, tuple(sl.get_shape()), DTYPES_BY_NAME[sl.get_dtype()])
                )
    except Exception as exc:
        raise ShardError(path, f"cannot read base weights ({exc})") from exc
    return specs


def _check_shape(path: Path, spec: TensorSpec, delta: _Delta) -> None:
    a, b, _ = delta
    if spec.shape != (b.shape[0], a.shape[1]):
        raise ShardError(
            path,
            f"base weight {list(spec.shape)} does not match LoRA "
            f"B{list(b.shape)} @ A{list(a.shape)}",
            key=spec.name,
        )


def _plan(base_dir: Path, files: list[str], deltas: dict[str, _Delta]) -> _Plan:
    """Read every base file's header; each delta must fit exactly one base weight."""
    pending = set(deltas)
    plans: _Plan = []
    for file in files:
        path = base_dir / file
        specs = _read_specs(path)
        for spec in specs:
            if spec.name in deltas:
                _check_shape(path, spec, deltas[spec.name])
                pending.discard(spec.name)
        plans.append((file, specs))
    if pending:
        first = sorted(pending)[0]
        raise ShardError(base_dir, "adapted module has no weight in the base checkpoint", key=first)
    return plans


def _copy_non_weights(base_dir: Path, weight_files: list[str], dst: Path) -> None:
    for item in base_dir.iterdir():
        if item.name in weight_files:
            continue
        if item.is_dir():
            shutil.copytree(item, dst / item.name)
        else:
            shutil.copy2(item, dst / item.name)


def _merged(weight: torch.Tensor, delta: _Delta) -> torch.Tensor:
    a, b, scale = delta
    return (weight.float() + scale * (b.float() @ a.float())).to(weight.dtype)


def _write_merged(src: Path, dst: Path, specs: list[TensorSpec], deltas: dict[str, _Delta]) -> None:
    """Stream ``src`` to ``dst`` one tensor at a time, folding in the deltas it has."""
    with _open(src) as f:

        def produce(spec: TensorSpec) -> torch.Tensor:
            weight: torch.Tensor = f.get_tensor(spec.name)
            delta = deltas.get(spec.name)
            return weight if delta is None else _merged(weight, delta)

        write_streaming(dst, specs, produce, metadata={"format": "pt"})


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
    scaling = _read_scaling(adapter_dir / ADAPTER_CONFIG)
    weights_file = adapter_dir / ADAPTER_WEIGHTS
    deltas = _deltas(_read_lora(weights_file), scaling, weights_file)
    files = _base_files(base_dir)
    plans = _plan(base_dir, files, deltas)
    with staged_directory(out, overwrite=overwrite) as staging:
        _copy_non_weights(base_dir, files, staging)
        for file, specs in plans:
            _write_merged(base_dir / file, staging / file, specs, deltas)
    return MergeResult(out, len(deltas), len(files), time.perf_counter() - started)
