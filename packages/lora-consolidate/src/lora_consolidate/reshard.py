"""Rewrite a sharded checkpoint for another world size, as FSDP2 would have saved it.

In the project's shard format every target rank's file is streamed from the source byte ranges
it needs (optimizer state too). As SkyRL's ``model_world_size_{W}_rank_{R}.pt`` files, each holds
DTensors whose local tensors are exactly what ``fully_shard`` on a W-rank mesh holds, so
``model.load_state_dict`` on the new mesh accepts them; each output rank file is built region by
region and saved before the next one starts: memory is one output rank file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Replicate

from lora_consolidate import keys
from lora_consolidate._atomic import staged_directory
from lora_consolidate.errors import ConsolidationError
from lora_consolidate.shards import ShardsCheckpoint, find_shards, reshard_to_shards
from lora_consolidate.sources import (
    ShardedCheckpoint,
    open_checkpoint,
    rank_file_name,
    shard_box,
)


@dataclass(frozen=True)
class ReshardResult:
    """What :func:`reshard` wrote: output directory, old and new world size, tensors, seconds.

    ``tensors`` counts tensors per rank set (model plus optimizer state); ``optimizer`` says
    whether optimizer state was resharded too.
    """

    out: Path
    source_world_size: int | None
    world_size: int
    tensors: int
    seconds: float
    output_format: str = "pt"
    optimizer: bool = False


def make_mesh(device_type: str, world_size: int, rank: int) -> Any:
    """A ``world_size``-rank ``DeviceMesh`` as seen from ``rank``, built without a process group.

    Raises:
        ConsolidationError: This torch cannot build a mesh without a process group.
    """
    from torch.distributed.device_mesh import DeviceMesh

    try:
        # No process group exists here: build the mesh object only, as if on ``rank``.
        return DeviceMesh(device_type, torch.arange(world_size), _init_backend=False, _rank=rank)
    except TypeError as exc:  # older torch without these keyword arguments
        raise ConsolidationError(
            f"this torch ({torch.__version__}) cannot build a DeviceMesh without a process "
            "group (DeviceMesh(_init_backend=False, _rank=...)); reshard needs a newer torch"
        ) from exc


def make_dtensor(local: torch.Tensor, mesh: Any, placement: Any, shape: tuple[int, ...]) -> DTensor:
    """A DTensor of global ``shape`` on ``mesh`` (``placement``) whose local shard is ``local``."""
    from torch.distributed.tensor._dtensor_spec import (  # pyright: ignore[reportPrivateUsage]
        DTensorSpec,
        TensorMeta,
    )

    stride = torch.empty(shape, device="meta").stride()
    spec = DTensorSpec(mesh, (placement,), TensorMeta(torch.Size(shape), stride, local.dtype))
    return DTensor(local, spec, requires_grad=False)  # pyright: ignore[reportCallIssue]


def reshard(
    checkpoint: Path | str,
    out: Path | str,
    world_size: int,
    *,
    lora_only: bool = False,
    source_world_size: int | None = None,
    overwrite: bool = False,
    output_format: str | None = None,
    hash_algorithm: str = "auto",
) -> ReshardResult:
    """Rewrite a checkpoint for ``world_size`` ranks into the new directory ``out``.

    ``output_format`` is ``"shards"`` (the project's shard format, :mod:`lora_consolidate.shards`;
    optimizer state included when the source holds it in that format) or ``"pt"``
    (``model_world_size_{W}_rank_{R}.pt`` DTensor files as FSDP2 saves them, model state only).
    By default a checkpoint keeps its format (DCP becomes ``"pt"``). Memory: the shard format is
    streamed through a few fixed buffers; ``"pt"`` holds one output rank file.
    ``hash_algorithm`` is the checksum the shard format's parts record (see ``write_rank_shards``).
    """
    if world_size < 1:
        raise ConsolidationError(f"world size must be >= 1, got {world_size}")
    if output_format not in (None, "shards", "pt"):
        raise ConsolidationError(f"output format must be 'shards' or 'pt', got {output_format!r}")
    started = time.perf_counter()
    out = Path(out)
    with open_checkpoint(checkpoint, source_world_size) as ckpt:
        fmt = output_format or ("shards" if isinstance(ckpt, ShardsCheckpoint) else "pt")
        optimizer = (
            fmt == "shards"
            and isinstance(ckpt, ShardsCheckpoint)
            and ckpt.world_size in find_shards(ckpt.path, "optim")[1]
        )
        with staged_directory(out, overwrite=overwrite) as staging:
            if fmt == "shards":
                tensors = reshard_to_shards(
                    ckpt,
                    staging,
                    world_size,
                    lora_only=lora_only,
                    optimizer=optimizer,
                    hash_algorithm=hash_algorithm,
                )
            else:
                tensors = _write_pt(ckpt, staging, world_size, lora_only=lora_only)
    return ReshardResult(
        out,
        ckpt.world_size,
        world_size,
        tensors,
        time.perf_counter() - started,
        output_format=fmt,
        optimizer=optimizer,
    )


def _write_pt(ckpt: ShardedCheckpoint, staging: Path, world_size: int, *, lora_only: bool) -> int:
    """Write ``model_world_size_{world_size}_rank_{R}.pt`` files, one output rank at a time."""
    specs = [s for s in ckpt.specs() if not lora_only or keys.adapter_name_of(s.name) is not None]
    if not specs:
        raise ConsolidationError(f"{ckpt.path}: nothing to reshard")
    layout = {s.name: ckpt.placement(s.name) for s in specs}
    extras = ckpt.extras()
    for rank in range(world_size):
        meshes: dict[str, Any] = {}
        state: dict[str, Any] = dict(extras)
        for spec in specs:
            placement, device_type = layout[spec.name]
            if placement is None:  # plain (replicated) tensor: every rank gets a copy
                state[spec.name] = ckpt.read(spec.name)
                continue
            if placement.is_shard() and not spec.shape:
                placement = Replicate()
            mesh = meshes.get(device_type)
            if mesh is None:
                mesh = meshes[device_type] = make_mesh(device_type, world_size, rank)
            box, _ = shard_box(
                spec.shape, (world_size,), (rank,), (placement,), where=ckpt.path, key=spec.name
            )
            local = ckpt.read(spec.name, box)
            state[spec.name] = make_dtensor(local, mesh, placement, spec.shape)
        torch.save(state, staging / rank_file_name(world_size, rank))
        del state
    return len(specs)
