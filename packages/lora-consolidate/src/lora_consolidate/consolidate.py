"""Sharded LoRA checkpoint -> one PEFT adapter directory, streamed tensor by tensor."""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from lora_consolidate import keys
from lora_consolidate._atomic import staged_directory
from lora_consolidate._hashing import AUTO, SHA256, resolve
from lora_consolidate._plan import FileRange
from lora_consolidate._safetensors_stream import TensorSpec, encode_header, tensor_bytes
from lora_consolidate._writer import ChunkedWriter
from lora_consolidate.errors import ConsolidationError
from lora_consolidate.sources import ShardedCheckpoint, open_checkpoint

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
VISION_EXCLUDE = r".*visual.*"


@dataclass(frozen=True)
class ConsolidateResult:
    """What :func:`consolidate` wrote: where, from which layout and world size, how much, how fast.

    ``vision_tensors_skipped`` counts the vision-tower LoRA tensors left out of the adapter;
    ``digest`` is the ``hash_algorithm`` checksum of ``adapter_model.safetensors``, computed as it
    was written.
    """

    out: Path
    source_kind: str
    world_size: int | None
    tensors: int
    bytes_written: int
    vision_tensors_skipped: int
    seconds: float
    hash_algorithm: str = ""
    digest: str = ""


@dataclass(frozen=True)
class _Selected:
    source: str  # key in the checkpoint
    spec: TensorSpec  # output name, shape, dtype
    source_dtype: torch.dtype


def select_adapter_tensors(
    ckpt: ShardedCheckpoint,
    *,
    adapter_name: str = "default",
    include_vision: bool = False,
    dtype: torch.dtype | None = None,
) -> tuple[list[_Selected], int]:
    """Pick the LoRA tensors of one adapter and name them as PEFT does; count skipped vision."""
    selected: list[_Selected] = []
    seen_adapters: set[str] = set()
    skipped_vision = 0
    names: dict[str, str] = {}
    for spec in ckpt.specs():
        found = keys.adapter_name_of(spec.name)
        if found is None:
            continue
        seen_adapters.add(found)
        name = keys.peft_key(spec.name, adapter_name)
        if name is None:
            continue
        if not include_vision and keys.is_vision_key(name):
            skipped_vision += 1
            continue
        if name in names:
            raise ConsolidationError(
                f"{ckpt.path}: keys {names[name]!r} and {spec.name!r} both map to {name!r}"
            )
        names[name] = spec.name
        out_spec = TensorSpec(name, spec.shape, dtype or spec.dtype)
        selected.append(_Selected(spec.name, out_spec, spec.dtype))
    if not selected:
        if seen_adapters and adapter_name not in seen_adapters:
            raise ConsolidationError(
                f"{ckpt.path}: no LoRA tensors for adapter {adapter_name!r}; "
                f"the checkpoint holds adapter(s) {sorted(seen_adapters)}"
            )
        raise ConsolidationError(f"{ckpt.path}: no LoRA tensors (keys with lora_A/lora_B) found")
    return selected, skipped_vision


def _find_config_file(checkpoint: Path) -> Path | None:
    # SkyRL writes global_step_N/{policy/, lora_adapter/adapter_config.json}.
    for candidate in (
        checkpoint / ADAPTER_CONFIG,
        checkpoint / "lora_adapter" / ADAPTER_CONFIG,
        checkpoint.parent / "lora_adapter" / ADAPTER_CONFIG,
    ):
        if candidate.is_file():
            return candidate
    return None


def _exclude_vision(exclude: Any) -> Any:
    """Extend PEFT's ``exclude_modules`` so a loader never wraps vision modules."""
    if not exclude:
        return VISION_EXCLUDE
    if isinstance(exclude, str):
        return exclude if "visual" in exclude else f"(?:{exclude})|{VISION_EXCLUDE}"
    # PEFT matches a list by exact name or dotted suffix; as a regex it reads:
    names = "|".join(re.escape(str(m)) for m in exclude)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    return rf"(?:.*\.)?(?:{names})|{VISION_EXCLUDE}"


def build_adapter_config(
    selected: list[_Selected],
    *,
    base: Mapping[str, Any] | None,
    lora_alpha: float | None,
    base_model_name: str | None,
    include_vision: bool,
    where: Path,
) -> dict[str, Any]:
    """PEFT ``adapter_config.json`` content, from a given config or inferred from the tensors."""
    ranks = Counter(s.spec.shape[0] for s in selected if s.spec.name.endswith(".lora_A.weight"))
    inferred_r = ranks.most_common(1)[0][0] if ranks else None
    leaf_names = sorted({keys.module_path(s.spec.name).rsplit(".", 1)[-1] for s in selected})
    config: dict[str, Any]
    if base is not None:
        config = dict(base)
        if config.get("peft_type", "LORA") != "LORA":
            raise ConsolidationError(f"{where}: peft_type {config['peft_type']!r} is not LORA")
        if config.get("use_dora"):
            raise ConsolidationError(f"{where}: DoRA adapters are not supported")
        r = config.get("r")
        if not config.get("rank_pattern") and inferred_r is not None and r != inferred_r:
            raise ConsolidationError(
                f"{where}: adapter config says r={r} but the shards hold rank {inferred_r}"
            )
        if lora_alpha is not None:
            config["lora_alpha"] = lora_alpha
    else:
        if lora_alpha is None:
            raise ConsolidationError(
                f"{where}: no adapter_config.json found beside the checkpoint; pass an adapter "
                "config file or lora_alpha (rank and target modules are read from the shards)"
            )
        if len(ranks) > 1:
            raise ConsolidationError(
                f"{where}: modules have different ranks {dict(ranks)}; pass an adapter config"
            )
        config = {
            "peft_type": "LORA",
            "task_type": None,
            "r": inferred_r,
            "lora_alpha": lora_alpha,
            "lora_dropout": 0.0,
            "target_modules": leaf_names,
            "exclude_modules": None,
            "bias": "none",
            "fan_in_fan_out": False,
            "use_rslora": False,
            "use_dora": False,
            "modules_to_save": None,
            "rank_pattern": {},
            "alpha_pattern": {},
            "init_lora_weights": True,
        }
    targets = config.get("target_modules")
    if isinstance(targets, set | tuple | list):
        config["target_modules"] = sorted(str(t) for t in cast(list[Any], targets))
    if not include_vision:
        config["exclude_modules"] = _exclude_vision(config.get("exclude_modules"))
    if base_model_name is not None:
        config["base_model_name_or_path"] = base_model_name
    config.setdefault("base_model_name_or_path", None)
    config["inference_mode"] = True
    return config


def load_config_arg(
    adapter_config: Mapping[str, Any] | Path | str | None,
) -> Mapping[str, Any] | None:
    """The ``adapter_config`` argument as a mapping: mappings and None pass through, a path is read.

    Raises:
        ConsolidationError: The file cannot be read or is not a JSON object.
    """
    if adapter_config is None or isinstance(adapter_config, Mapping):
        return adapter_config
    path = Path(adapter_config)
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConsolidationError(f"{path}: cannot read adapter config ({exc})") from exc
    if not isinstance(loaded, dict):
        raise ConsolidationError(f"{path}: adapter config is not a JSON object")
    return loaded  # pyright: ignore[reportUnknownVariableType]


def write_adapter_weights(
    path: Path, ckpt: ShardedCheckpoint, selected: list[_Selected], *, algorithm: str = SHA256
) -> tuple[int, str]:
    """Stream the selected tensors into a new safetensors file; return (data bytes, digest).

    The header is written first (every shape is known), then each tensor's bytes straight from
    the shard files where they can be copied as they are (see ``_plan``); the file is hashed as
    it is written.
    """
    prefix = encode_header([s.spec for s in selected], {"format": "pt"})
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        with ChunkedWriter(fd, algorithm=algorithm) as out:
            out.write(prefix)
            for sel in selected:
                if sel.spec.dtype != sel.source_dtype:
                    out.write(tensor_bytes(ckpt.read(sel.source).to(sel.spec.dtype)))
                    continue
                for seg in ckpt.segments(sel.source):
                    if isinstance(seg, FileRange):
                        out.copy_range(
                            seg.fd, seg.offset, seg.nbytes, where=seg.path, key=sel.source
                        )
                    else:
                        out.write(seg)
            size, sha = out.finish()
    finally:
        os.close(fd)
    return size - len(prefix), sha


def consolidate(
    checkpoint: Path | str,
    out: Path | str,
    *,
    adapter_config: Mapping[str, Any] | Path | str | None = None,
    lora_alpha: float | None = None,
    base_model_name: str | None = None,
    include_vision: bool = False,
    adapter_name: str = "default",
    dtype: torch.dtype | None = None,
    world_size: int | None = None,
    overwrite: bool = False,
    loader: str = "auto",
    hash_algorithm: str = AUTO,
) -> ConsolidateResult:
    """Write ``out/adapter_model.safetensors`` + ``out/adapter_config.json`` from a checkpoint.

    The sharded checkpoint is streamed: shard bytes are copied through a few fixed buffers (a
    tensor is assembled in memory only when its shards cannot be copied as they are), and the
    output is hashed as it is written (``ConsolidateResult.digest``).

    ``adapter_config`` may be a mapping or a JSON file; if omitted, ``adapter_config.json`` is
    looked for in the checkpoint, its ``lora_adapter/`` or its sibling ``lora_adapter/`` (SkyRL
    layout), else built from the shards plus ``lora_alpha``. Output appears atomically.
    ``loader`` picks how ``torch.save`` rank files are read (``RankFileCheckpoint``);
    ``hash_algorithm`` the checksum computed while writing (``sha256``, ``xxh3-128``, or
    ``auto``: ``xxh3-128`` when ``xxhash`` is installed, as ``weight_sync.AdapterStore``).
    """
    started = time.perf_counter()
    checkpoint = Path(checkpoint)
    out = Path(out)
    algorithm = resolve(hash_algorithm)
    config_source = load_config_arg(adapter_config)
    config_where = checkpoint
    if config_source is None:
        found = _find_config_file(checkpoint)
        if found is not None:
            config_source = load_config_arg(found)
            config_where = found
    elif not isinstance(adapter_config, Mapping) and adapter_config is not None:
        config_where = Path(adapter_config)
    with open_checkpoint(checkpoint, world_size, loader=loader) as ckpt:
        selected, skipped = select_adapter_tensors(
            ckpt, adapter_name=adapter_name, include_vision=include_vision, dtype=dtype
        )
        config = build_adapter_config(
            selected,
            base=config_source,
            lora_alpha=lora_alpha,
            base_model_name=base_model_name,
            include_vision=include_vision,
            where=config_where,
        )
        with staged_directory(out, overwrite=overwrite) as staging:
            written, digest = write_adapter_weights(
                staging / ADAPTER_WEIGHTS, ckpt, selected, algorithm=algorithm
            )
            (staging / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True))
        return ConsolidateResult(
            out=out,
            source_kind=ckpt.kind,
            world_size=ckpt.world_size,
            tensors=len(selected),
            bytes_written=written,
            vision_tensors_skipped=skipped,
            seconds=time.perf_counter() - started,
            hash_algorithm=algorithm,
            digest=digest,
        )
