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
  OUT/shards/                                     the LoRA weights in lora-consolidate's shard format
  OUT/trained/                                    after one AdamW step: weights + optimizer state as
                                                  shards (index merged by rank 0), and
  OUT/trained_full.pt                             their gathered (unsharded) values
With --load DIR, the ranks first build a differently seeded model, load their own rank file from
DIR with ``load_state_dict`` (a resume on this world size), and rank 0 writes the gathered LoRA
tensors and the sharded model's logits to OUT/resumed.pt. With --reshard-to-next the trained
shards are resharded too, and the next world size's ranks load weights and optimizer state from
them with ``load_rank_shards`` + ``set_optimizer_state_dict``; rank 0 writes what they hold,
gathered, to OUT/resumed_shards.pt.
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
from torch.distributed.tensor import DTensor
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


def _train_step(model: Any) -> Any:
    """One AdamW step on a fixed batch, so the optimizer holds real exp_avg/exp_avg_sq/step."""
    from tiny_qwen3vl import sample_input_ids

    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=1e-2)
    model.train()
    loss = model(input_ids=sample_input_ids(seed=1)).logits.float().pow(2).mean()
    loss.backward()
    optim.step()
    optim.zero_grad()
    model.eval()
    return optim


def _gather(model: Any, optim: Any) -> dict[str, Any]:
    """Full (unsharded) LoRA weights and optimizer state; a collective, every rank calls it."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    def full(v: Any) -> Any:
        return v.full_tensor() if isinstance(v, DTensor) else v

    osd: dict[str, Any] = dict(get_optimizer_state_dict(model, optim))
    state: dict[str, dict[str, Any]] = osd["state"]
    return {
        "lora": {k: full(v) for k, v in model.state_dict().items() if "lora_" in k},
        "optim": {p: {f: full(v) for f, v in st.items()} for p, st in state.items()},
        "param_groups": osd["param_groups"],
    }


def _resume_from_shards(rank: int, world: int, out_dir: Path, load: str) -> None:
    """A fresh job on this world size loads model and optimizer state from shard-format files."""
    from tiny_qwen3vl import build_peft
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    from lora_consolidate.shards import load_rank_shards

    model = _shard(build_peft(seed=123, include_vision=True), world)
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    template = get_optimizer_state_dict(model, optim)  # initialises the (zero) state
    model_sd, optim_sd = load_rank_shards(load, model.state_dict(), optimizer=template)
    model.load_state_dict(model_sd, strict=False)
    assert optim_sd is not None
    # Text-only batches give the vision LoRA no gradient, so AdamW holds no state for it.
    set_optimizer_state_dict(model, optim, optim_sd, options=StateDictOptions(strict=False))
    gathered = _gather(model, optim)
    if rank == 0:
        torch.save(gathered, out_dir / "resumed_shards.pt")


def _write_shards(rank: int, world: int, out_dir: Path, model: Any) -> None:
    """The untrained LoRA weights, then one trained step with its optimizer state, as shards."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from lora_consolidate.shards import finalize_rank_shards, write_rank_shards

    write_rank_shards(model.state_dict(), out_dir / "shards", rank, world, tag="untrained")
    optim = _train_step(model)
    osd = get_optimizer_state_dict(model, optim)
    write_rank_shards(model.state_dict(), out_dir / "trained", rank, world, optimizer=osd, tag="1")
    dist.barrier()
    if rank == 0:
        finalize_rank_shards(out_dir / "trained", world)
    gathered = _gather(model, optim)
    if rank == 0:
        torch.save(gathered, out_dir / "trained_full.pt")


def _worker(  # noqa: PLR0917 - start_processes passes arguments by position
    rank: int, world: int, out: str, port: int, load: str | None, load_shards: str | None
) -> None:
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
    if load_shards is not None:
        _resume_from_shards(rank, world, out_dir, load_shards)
    _write_shards(rank, world, out_dir, model)
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
    load_shards: str | None = None
    for i, world in enumerate(worlds):
        start_processes(
            _worker,
            args=(world, str(out / f"w{world}"), _free_port(), load, load_shards),
            nprocs=world,
            join=True,
            start_method="fork",
        )
        if reshard_next and i + 1 < len(worlds):
            load = str(out / "resharded")
            reshard(out / f"w{world}" / "full", load, worlds[i + 1])
            load_shards = str(out / "resharded-shards")
            reshard(out / f"w{world}" / "trained", load_shards, worlds[i + 1])


if __name__ == "__main__":
    main()
