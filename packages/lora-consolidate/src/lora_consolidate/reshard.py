"""Rewrite a sharded checkpoint for another world size, as FSDP2 would have saved it.

Output files use SkyRL's names (``model_world_size_{W}_rank_{R}.pt``) and hold DTensors whose
local tensors are exactly what ``fully_shard`` on a W-rank mesh holds, so ``model.load_state_dict``
on the new mesh accepts them. Each output rank file is built region by region from the source and
saved before the next one starts: memory is bounded by one output rank file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

from lora_consolidate import keys
from lora_consolidate._atomic import staged_directory
from lora_consolidate.errors import ConsolidationError
from lora_consolidate.sources import (
    RankFileCheckpoint,
    ShardedCheckpoint,
    open_checkpoint,
    rank_file_name,
    shard_box,
)


@dataclass(frozen=True)
class ReshardResult:
    """What :func:`reshard` wrote: output directory, old and new world size, tensors, seconds."""

    out: Path
    source_world_size: int | None
    world_size: int
    tensors: int
    seconds: float


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


def _source_placement(ckpt: ShardedCheckpoint, name: str) -> tuple[Any | None, str]:
    """Keep the source's sharded dim (FSDP2 may shard a dim other than 0) and device type."""
    if isinstance(ckpt, RankFileCheckpoint):
        value = ckpt.value(0, name)
        if not isinstance(value, DTensor):
            return None, "cpu"
        placements = value.placements
        device_type = value.device_mesh.device_type
        if len(placements) == 1 and isinstance(placements[0], Shard | Replicate):
            return placements[0], device_type
        return Shard(0), device_type
    return Shard(0), "cpu"


def reshard(
    checkpoint: Path | str,
    out: Path | str,
    world_size: int,
    *,
    lora_only: bool = False,
    source_world_size: int | None = None,
    overwrite: bool = False,
) -> ReshardResult:
    """Write ``out/model_world_size_{world_size}_rank_{R}.pt`` for every new rank R."""
    if world_size < 1:
        raise ConsolidationError(f"world size must be >= 1, got {world_size}")
    started = time.perf_counter()
    out = Path(out)
    with open_checkpoint(checkpoint, source_world_size) as ckpt:
        specs = [
            s for s in ckpt.specs() if not lora_only or keys.adapter_name_of(s.name) is not None
        ]
        if not specs:
            raise ConsolidationError(f"{ckpt.path}: nothing to reshard")
        layout = {s.name: _source_placement(ckpt, s.name) for s in specs}
        extras = ckpt.extras()
        with staged_directory(out, overwrite=overwrite) as staging:
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
                        spec.shape,
                        (world_size,),
                        (rank,),
                        (placement,),
                        where=ckpt.path,
                        key=spec.name,
                    )
                    local = ckpt.read(spec.name, box)
                    state[spec.name] = make_dtensor(local, mesh, placement, spec.shape)
                torch.save(state, staging / rank_file_name(world_size, rank))
                del state
    return ReshardResult(
        out, ckpt.world_size, world_size, len(specs), time.perf_counter() - started
    )
