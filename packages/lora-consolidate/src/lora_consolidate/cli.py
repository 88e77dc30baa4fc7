"""``lora-consolidate`` command line: consolidate, merge, reshard, inspect."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from lora_consolidate.consolidate import consolidate
from lora_consolidate.errors import ConsolidationError
from lora_consolidate.merge import merge_adapter
from lora_consolidate.reshard import reshard
from lora_consolidate.sources import RANK_FILE_RE, open_checkpoint

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lora-consolidate",
        description="Stream FSDP2/DCP sharded LoRA checkpoints into one PEFT adapter.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("consolidate", help="sharded checkpoint -> PEFT adapter directory")
    c.add_argument(
        "checkpoint",
        type=Path,
        help="a SkyRL step directory (ckpt/global_step_N), its policy/, a DCP directory or a "
        "directory of rank files",
    )
    c.add_argument("--out", type=Path, required=True, help="directory for the PEFT adapter")
    c.add_argument("--adapter-config", type=Path, help="adapter_config.json to start from")
    c.add_argument("--lora-alpha", type=float, help="needed when no adapter config is found")
    c.add_argument("--base-model", help="base_model_name_or_path written to the config")
    c.add_argument("--adapter-name", default="default", help="peft adapter name in the keys")
    c.add_argument("--include-vision", action="store_true", help="keep vision-tower LoRA")
    c.add_argument("--dtype", choices=sorted(_DTYPES), help="cast tensors (default: as saved)")
    c.add_argument("--world-size", type=int, help="pick rank files of this world size")
    c.add_argument(
        "--merge", type=Path, metavar="BASE_DIR", help="write base+adapter merged model instead"
    )
    c.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    c.add_argument(
        "--hash",
        choices=["auto", "sha256", "xxh3-128"],
        default="auto",
        help="checksum computed while writing (auto: xxh3-128 when xxhash is installed)",
    )

    m = sub.add_parser("merge", help="fold a PEFT adapter into base safetensors weights")
    m.add_argument("adapter", type=Path, help="PEFT adapter directory")
    m.add_argument("--base", type=Path, required=True, help="base model directory (safetensors)")
    m.add_argument("--out", type=Path, required=True, help="directory for the merged model")
    m.add_argument("--overwrite", action="store_true", help="replace an existing --out")

    r = sub.add_parser("reshard", help="rewrite rank files for another world size")
    r.add_argument(
        "checkpoint", type=Path, help="a step directory, its policy/ or a directory of rank files"
    )
    r.add_argument("--world-size", type=int, required=True, help="new world size")
    r.add_argument(
        "--source-world-size", type=int, help="read rank files of this world size (if several)"
    )
    r.add_argument("--out", type=Path, required=True, help="directory for the new rank files")
    r.add_argument("--lora-only", action="store_true", help="keep only LoRA tensors")
    r.add_argument(
        "--format",
        choices=["shards", "pt"],
        help="output: the shard format (with optimizer state) or SkyRL .pt files "
        "(default: as the input; DCP gives pt)",
    )
    r.add_argument("--overwrite", action="store_true", help="replace an existing --out")

    i = sub.add_parser("inspect", help="validate a checkpoint and list its tensors")
    i.add_argument(
        "checkpoint", type=Path, help="a step directory, its policy/, a DCP or rank-file directory"
    )
    i.add_argument("--world-size", type=int, help="pick rank files of this world size")
    return p


def _checkpoint_dir(path: Path) -> Path:
    """The shards of ``path``: a SkyRL step directory (``global_step_N``) means its ``policy/``."""
    if not path.is_dir() or (path / ".metadata").is_file() or not (path / "policy").is_dir():
        return path
    if any(RANK_FILE_RE.match(p.name) for p in path.iterdir()):
        return path
    return path / "policy"


def _summary(result: Any) -> str:
    return json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in asdict(result).items()})


def _run(args: argparse.Namespace) -> None:
    if args.command in ("consolidate", "reshard", "inspect"):
        args.checkpoint = _checkpoint_dir(args.checkpoint)
    if args.command == "consolidate":
        kwargs: dict[str, Any] = {
            "adapter_config": args.adapter_config,
            "lora_alpha": args.lora_alpha,
            "base_model_name": args.base_model,
            "include_vision": args.include_vision,
            "adapter_name": args.adapter_name,
            "dtype": _DTYPES[args.dtype] if args.dtype else None,
            "world_size": args.world_size,
            "hash_algorithm": args.hash,
        }
        if args.merge is None:
            print(
                _summary(consolidate(args.checkpoint, args.out, overwrite=args.overwrite, **kwargs))
            )
            return
        out: Path = args.out.absolute()
        # The intermediate adapter lives beside the output (same filesystem) and is always removed.
        tmp = out.parent / f".{out.name}.adapter-{uuid.uuid4().hex[:12]}"
        try:
            consolidate(args.checkpoint, tmp, **kwargs)
            print(_summary(merge_adapter(tmp, args.merge, out, overwrite=args.overwrite)))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    elif args.command == "merge":
        print(_summary(merge_adapter(args.adapter, args.base, args.out, overwrite=args.overwrite)))
    elif args.command == "reshard":
        result = reshard(
            args.checkpoint,
            args.out,
            args.world_size,
            lora_only=args.lora_only,
            source_world_size=args.source_world_size,
            overwrite=args.overwrite,
            output_format=args.format,
        )
        print(_summary(result))
    else:
        with open_checkpoint(args.checkpoint, args.world_size) as ckpt:
            specs = ckpt.specs()
            print(f"{ckpt.kind} checkpoint at {ckpt.path}, world size {ckpt.world_size}")
            for s in specs:
                print(f"  {s.name}  {list(s.shape)}  {str(s.dtype).removeprefix('torch.')}")
            total = sum(s.nbytes for s in specs)
            print(f"{len(specs)} tensors, {total} bytes")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``lora-consolidate``; returns 0, or 2 after printing a :class:`ConsolidationError`."""
    args = _parser().parse_args(argv)
    try:
        _run(args)
    except ConsolidationError as exc:
        print(f"lora-consolidate: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
