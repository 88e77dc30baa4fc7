"""The shard format, written by real FSDP2 ranks: consolidation from every input format gives the
same bytes, resharding keeps weights and optimizer state exact, and an FSDP job resumes from it."""

from __future__ import annotations

import filecmp
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import Reference, Sharded
from safetensors.torch import load_file  # pyright: ignore[reportUnknownVariableType]
from torch.distributed.tensor import Shard

from lora_consolidate import consolidate, open_checkpoint, reshard
from lora_consolidate.cli import main
from lora_consolidate.keys import is_vision_key
from lora_consolidate.reshard import make_dtensor, make_mesh
from lora_consolidate.shards import (
    LocalShard,
    ShardsCheckpoint,
    finalize_rank_shards,
    index_file_name,
    write_rank_shards,
)
from lora_consolidate.sources import RankFileCheckpoint
from weight_sync import fs


def test_every_input_format_gives_byte_identical_adapters(
    sharded: Sharded, reference: Reference, tmp_path: Path
) -> None:
    config = sharded.full(2) / "lora_adapter" / "adapter_config.json"
    resharded = reshard(sharded.shards(2), tmp_path / "in-resharded", 3)
    from_pt = reshard(sharded.full(2), tmp_path / "in-from-pt", 3, output_format="shards")
    assert (resharded.output_format, from_pt.output_format) == ("shards", "shards")
    sources: dict[str, tuple[Path, str]] = {
        "pt-fast": (sharded.full(2), "fast"),
        "pt-torch.load": (sharded.full(2), "torch"),
        "pt-lora-only-w3": (sharded.lora(3), "auto"),
        "dcp": (sharded.dcp(2), "auto"),
        "shards-w2": (sharded.shards(2), "auto"),
        "shards-w3": (sharded.shards(3), "auto"),
        "shards-resharded": (resharded.out, "auto"),
        "pt-resharded-to-shards": (from_pt.out, "auto"),
    }
    digests: dict[str, str] = {}
    for name, (src, loader) in sources.items():
        result = consolidate(
            src, tmp_path / name, adapter_config=config, loader=loader, hash_algorithm="sha256"
        )
        data = (tmp_path / name / "adapter_model.safetensors").read_bytes()
        assert result.digest == hashlib.sha256(data).hexdigest(), name  # hashed while written
        digests[name] = result.digest
    assert len(set(digests.values())) == 1, digests
    # The fast checksum is the one weight-sync's manifests record for the same bytes.
    fast = consolidate(
        sharded.shards(2), tmp_path / "xxh3", adapter_config=config, hash_algorithm="xxh3-128"
    )
    weights = tmp_path / "xxh3" / "adapter_model.safetensors"
    assert (fast.hash_algorithm, fast.digest) == ("xxh3-128", fs.hash_file(weights, "xxh3-128")[1])
    got = load_file(tmp_path / "shards-w2" / "adapter_model.safetensors")
    want = {k: v for k, v in reference.adapter.items() if not is_vision_key(k)}
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_fast_and_torch_load_readers_agree_on_fsdp_files(sharded: Sharded) -> None:
    with (
        RankFileCheckpoint(sharded.full(3), loader="fast") as fast,
        RankFileCheckpoint(sharded.full(3), loader="torch") as slow,
    ):
        assert (fast.loader, slow.loader) == ("fast", "torch")
        assert fast.specs() == slow.specs()
        for spec in fast.specs():
            assert fast.placement(spec.name) == slow.placement(spec.name)
            assert torch.equal(fast.read(spec.name), slow.read(spec.name)), spec.name


def test_reshard_2_to_3_writes_what_a_3_rank_job_writes(sharded: Sharded, tmp_path: Path) -> None:
    out = reshard(sharded.shards(2), tmp_path / "w3", 3).out
    theirs = sorted(p.name for p in sharded.shards(3).iterdir())
    assert theirs and all(
        filecmp.cmp(out / n, sharded.shards(3) / n, shallow=False) for n in theirs
    )
    assert (out / index_file_name("model", 3)).is_file()  # and the merged index on top


def _load_full(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=False)


def test_fsdp_job_resumes_weights_and_optimizer_from_resharded_shards(sharded: Sharded) -> None:
    # 2 ranks trained one AdamW step and wrote shards with their optimizer state; they were
    # resharded to 3 ranks; a 3-rank FSDP job built from another seed loaded them with
    # load_rank_shards + set_optimizer_state_dict and gathered what it then held.
    want = _load_full(sharded.trained_full(2))
    got = _load_full(sharded.resumed_shards)
    assert sorted(got["lora"]) == sorted(want["lora"])
    assert all(torch.equal(got["lora"][k], v) for k, v in want["lora"].items())
    assert sorted(got["optim"]) == sorted(want["optim"]) != []
    for param, fields in want["optim"].items():
        assert sorted(fields) == ["exp_avg", "exp_avg_sq", "step"]
        for name, value in fields.items():
            assert torch.equal(got["optim"][param][name], value), (param, name)
    assert got["param_groups"] == want["param_groups"]
    assert float(next(iter(want["optim"].values()))["step"]) == 1.0


def test_reshard_3_to_1_keeps_optimizer_state_exact(sharded: Sharded, tmp_path: Path) -> None:
    result = reshard(sharded.resharded_shards, tmp_path / "w1", 1)
    assert (result.source_world_size, result.world_size, result.optimizer) == (3, 1, True)
    want = _load_full(sharded.trained_full(2))
    with ShardsCheckpoint(result.out, kind="optim") as optim:
        assert optim.extras()["param_groups"] == json.loads(json.dumps(want["param_groups"]))
        for param, fields in want["optim"].items():
            for name, value in fields.items():
                assert torch.equal(optim.read(f"{param}.{name}"), value), (param, name)
    with ShardsCheckpoint(result.out) as model:
        for key, value in want["lora"].items():
            assert torch.equal(model.read(key), value), key


def test_merged_index_and_rank_parts_read_the_same(sharded: Sharded, tmp_path: Path) -> None:
    # trained(2) has the merged index; copy its rank files only and merge here.
    parts = tmp_path / "parts"
    parts.mkdir()
    for f in sharded.trained(2).iterdir():
        if "_rank_" in f.name:
            (parts / f.name).write_bytes(f.read_bytes())
    with open_checkpoint(parts) as a, open_checkpoint(sharded.trained(2)) as b:
        assert a.specs() == b.specs()
        assert all(torch.equal(a.read(s.name), b.read(s.name)) for s in a.specs())
    written = finalize_rank_shards(parts, 2)
    assert [p.name for p in written] == [index_file_name(k, 2) for k in ("model", "optim")]
    assert all(
        filecmp.cmp(p, sharded.trained(2) / p.name, shallow=False) for p in written
    )  # deterministic


def test_local_shards_and_replicated_tensors_round_trip(tmp_path: Path) -> None:
    # Without DTensors: hand-made regions, a column split (not row-contiguous), a plain tensor.
    gen = torch.Generator().manual_seed(0)
    cols = torch.randn(6, 10, generator=gen)
    rows = torch.randn(7, 3, generator=gen).to(torch.bfloat16)
    scalar = torch.tensor(5.0)
    world = 3
    for rank in range(world):
        c0, c1 = [0, 4, 7, 10][rank], [0, 4, 7, 10][rank + 1]
        r0, r1 = [0, 3, 6, 7][rank], [0, 3, 6, 7][rank + 1]
        state = {
            "cols": LocalShard(cols[:, c0:c1].clone(), (6, 10), (0, c0), shard_dim=1),
            "rows": LocalShard(rows[r0:r1].clone(), (7, 3), (r0, 0)),
            "scalar": scalar,
        }
        write_rank_shards(state, tmp_path / "ck", rank, world, lora_only=False)
    with ShardsCheckpoint(tmp_path / "ck") as ckpt:
        assert [s.name for s in ckpt.specs()] == ["cols", "rows", "scalar"]
        assert torch.equal(ckpt.read("cols"), cols)
        assert torch.equal(ckpt.read("cols", ((1, 2), (3, 5))), cols[1:4, 2:7])
        assert torch.equal(ckpt.read("rows"), rows)
        assert torch.equal(ckpt.read("scalar"), scalar)
        assert ckpt.placement("cols") == (Shard(1), "cpu")
    part = json.loads((tmp_path / "ck" / "model_world_size_3_rank_1.index.json").read_text())
    assert [row[0] for row in part["tensors"]] == ["cols", "rows"]  # rank 0 alone stores "scalar"
    # Reshard keeps the split dim: 3 column shards become 2.
    out = reshard(tmp_path / "ck", tmp_path / "w2", 2).out
    part = json.loads((out / "model_world_size_2_rank_1.index.json").read_text())
    assert part["tensors"][0] == ["cols", "F32", [6, 10], [0, 5], [6, 5], "S1"]
    with ShardsCheckpoint(out) as ckpt:
        assert torch.equal(ckpt.read("cols"), cols)


def test_write_rank_shards_from_dtensors_without_a_process_group(tmp_path: Path) -> None:
    full = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    for rank in range(4):
        local = full.chunk(4)[rank].clone()
        dt = make_dtensor(local, make_mesh("cpu", 4, rank), Shard(0), (10, 4))
        write_rank_shards({"w.lora_A.default.weight": dt}, tmp_path, rank, 4, tag="t")
    finalize_rank_shards(tmp_path, 4)
    with ShardsCheckpoint(tmp_path) as ckpt:
        assert ckpt.tag == "t"
        assert torch.equal(ckpt.read("w.lora_A.default.weight"), full)


def test_cli_reshard_format_and_inspect(
    sharded: Sharded, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "w1"
    args = ["reshard", str(sharded.trained(2)), "--world-size", "1", "--out", str(out)]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["output_format"], summary["optimizer"]) == ("shards", True)
    assert main(["inspect", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"shards checkpoint at {out}, world size 1")
    assert main([*args[:-1], str(tmp_path / "pt"), "--format", "pt"]) == 0
    assert [p.name for p in (tmp_path / "pt").iterdir()] == ["model_world_size_1_rank_0.pt"]
