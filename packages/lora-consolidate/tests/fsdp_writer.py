"""Run real multi-process FSDP2 (gloo, CPU) on the tiny Qwen3-VL + LoRA model.

Usage: python fsdp_writer.py OUT WORLD [WORLD ...] [--reshard-to-next]

For each WORLD in turn, WORLD processes are forked (torch, transformers and peft are imported
once in the parent: importing them costs ~20 s per process on a 2-core CI box) and write into
OUT/wW/. With --reshard-to-next, after the first world size ``lora_consolidate.reshard`` rewrites OUT/w{first}/full for the next world size into OUT/resharded, and
the next world size's ranks resume from it (see --load below) before writing their own files.

Every rank builds the same seeded model, applies ``fully_shard`` to each decoder layer and the
root, and writes:
  OUT/full/policy/model_world_size_W_rank_R.pt   the whole FSDP state dict (as SkyRL saves it)
  OUT/lora/policy/model_world_size_W_rank_R.pt   only the LoRA entries
  OUT/dcp/                                        the whole state dict via torch.distributed.checkpoint
With --load DIR, the ranks first build a differently seeded model, load their own rank file from
DIR with ``load_state_dict`` (a resume on this world size), and rank 0 writes the gathered LoRA
tensors and the sharded model's logits to OUT/resumed.pt.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import (
    start_processes,  # pyright: ignore[reportUnknownVariableType]
)

sys.path.insert(0, str(Path(__file__).parent))


def _shard(model: Any, world: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for layer in model.base_model.model.model.language_model.layers:
        fully_shard(layer, mesh=mesh)
    for block in model.base_model.model.model.visual.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _worker(rank: int, world: int, out: str, port: int, load: str | None) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from tiny_qwen3vl import build_peft, sample_input_ids
    from torch.distributed.checkpoint.state_dict_saver import (
        save as dcp_save,  # pyright: ignore[reportUnknownVariableType]
    )

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if load is not None:
        model = _shard(build_peft(seed=123, include_vision=True), world)
        state = torch.load(
            Path(load) / f"model_world_size_{world}_rank_{rank}.pt", weights_only=True
        )
        model.load_state_dict(state, strict=False)
        gathered = {k: v.full_tensor() for k, v in model.state_dict().items() if "lora_" in k}
        with torch.no_grad():
            logits = model(input_ids=sample_input_ids()).logits
        if rank == 0:
            torch.save({"lora": gathered, "logits": logits}, out_dir / "resumed.pt")
    model = build_peft(seed=0, include_vision=True)
    if rank == 0:  # SkyRL keeps the LoRA config beside policy/ (here: full/lora_adapter/)
        model.peft_config["default"].save_pretrained(str(out_dir / "full" / "lora_adapter"))
    model = _shard(model, world)
    state = model.state_dict()
    name = f"model_world_size_{world}_rank_{rank}.pt"
    for sub, sd in (("full", state), ("lora", {k: v for k, v in state.items() if "lora_" in k})):
        (out_dir / sub / "policy").mkdir(parents=True, exist_ok=True)
        torch.save(sd, out_dir / sub / "policy" / name)
    dcp_save(state, checkpoint_id=str(out_dir / "dcp"))
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    args = sys.argv[1:]
    reshard_next = "--reshard-to-next" in args
    args = [a for a in args if a != "--reshard-to-next"]
    out = Path(args[0])
    worlds = [int(a) for a in args[1:]]
    # Imported before forking so the children inherit them instead of paying ~20 s each.
    importlib.import_module("peft")
    importlib.import_module("tiny_qwen3vl")

    from lora_consolidate import reshard

    torch.set_num_threads(1)
    load: str | None = None
    for i, world in enumerate(worlds):
        start_processes(
            _worker,
            args=(world, str(out / f"w{world}"), _free_port(), load),
            nprocs=world,
            join=True,
            start_method="fork",
        )
        if reshard_next and i + 1 < len(worlds):
            load = str(out / "resharded")
            reshard(out / f"w{world}" / "full", load, worlds[i + 1])


if __name__ == "__main__":
    main()
