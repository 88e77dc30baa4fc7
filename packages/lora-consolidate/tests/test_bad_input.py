"""Bad shards: every case raises a typed error naming the file, and leaves no output behind."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import Sharded

from lora_consolidate import (
    ConsolidationError,
    OutputExistsError,
    ShardError,
    consolidate,
    reshard,
)
from lora_consolidate.cli import main


def _copy_ranks(src: Path, dst: Path, ranks: list[int], world: int) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for r in ranks:
        name = f"model_world_size_{world}_rank_{r}.pt"
        shutil.copy(src / "policy" / name, dst / name)
    return dst


def _assert_nothing_written(parent: Path) -> None:
    assert not (parent / "out").exists()
    assert not [p for p in parent.iterdir() if ".staging-" in p.name]


def _expect(ckpt: Path, tmp_path: Path, match: str, fragment: str) -> ShardError:
    with pytest.raises(ShardError, match=match) as info:
        consolidate(ckpt, tmp_path / "out", lora_alpha=16)
    assert fragment in str(info.value)
    assert fragment in str(info.value.path)
    _assert_nothing_written(tmp_path)
    return info.value


def test_missing_rank(sharded: Sharded, tmp_path: Path) -> None:
    ckpt = _copy_ranks(sharded.lora(3), tmp_path / "ckpt", [0, 2], 3)
    _expect(ckpt, tmp_path, "missing rank", "model_world_size_3_rank_1.pt")


def test_rank_files_of_two_world_sizes(sharded: Sharded, tmp_path: Path) -> None:
    ckpt = _copy_ranks(sharded.lora(2), tmp_path / "ckpt", [0, 1], 2)
    _copy_ranks(sharded.lora(3), ckpt, [0], 3)
    _expect(ckpt, tmp_path, r"several world sizes \[2, 3\]", "ckpt")
    # Naming the world size picks the complete set.
    assert consolidate(ckpt, tmp_path / "out", lora_alpha=16, world_size=2).world_size == 2


def test_file_saved_by_another_world_size(sharded: Sharded, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for r in range(2):  # 3-rank shards renamed as if from a 2-rank run
        shutil.copy(
            sharded.lora(3) / "policy" / f"model_world_size_3_rank_{r}.pt",
            ckpt / f"model_world_size_2_rank_{r}.pt",
        )
    _expect(ckpt, tmp_path, "mismatched world sizes", "model_world_size_2_rank_0.pt")


def test_truncated_rank_file(sharded: Sharded, tmp_path: Path) -> None:
    ckpt = _copy_ranks(sharded.lora(2), tmp_path / "ckpt", [0, 1], 2)
    victim = ckpt / "model_world_size_2_rank_1.pt"
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    _expect(ckpt, tmp_path, "truncated or corrupt", "model_world_size_2_rank_1.pt")


def test_shapes_that_do_not_add_up(sharded: Sharded, tmp_path: Path) -> None:
    ckpt = _copy_ranks(sharded.lora(3), tmp_path / "ckpt", [0, 1], 3)
    # Rank 0's shards (3 rows of each 8-row lora_A) where rank 2 (2 rows) belongs.
    shutil.copy(ckpt / "model_world_size_3_rank_0.pt", ckpt / "model_world_size_3_rank_2.pt")
    err = _expect(ckpt, tmp_path, "does not add up", "model_world_size_3_rank_2.pt")
    assert err.key is not None


def test_key_missing_from_one_rank(sharded: Sharded, tmp_path: Path) -> None:
    ckpt = _copy_ranks(sharded.lora(2), tmp_path / "ckpt", [0, 1], 2)
    victim = ckpt / "model_world_size_2_rank_1.pt"
    state = torch.load(victim, weights_only=True)
    dropped = sorted(state)[3]
    del state[dropped]
    torch.save(state, victim)
    err = _expect(ckpt, tmp_path, "missing here", "model_world_size_2_rank_1.pt")
    assert err.key == dropped


def test_dcp_missing_and_truncated_storage(sharded: Sharded, tmp_path: Path) -> None:
    ckpt = tmp_path / "dcp"
    shutil.copytree(sharded.dcp(2), ckpt)
    (ckpt / "__1_0.distcp").unlink()
    _expect(ckpt, tmp_path, "is missing", "__1_0.distcp")
    shutil.copy(sharded.dcp(2) / "__1_0.distcp", ckpt / "__1_0.distcp")
    victim = ckpt / "__0_0.distcp"
    victim.write_bytes(victim.read_bytes()[:1000])
    _expect(ckpt, tmp_path, "truncated", "__0_0.distcp")


def test_corrupt_bytes_mid_stream_leave_no_partial_output(sharded: Sharded, tmp_path: Path) -> None:
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    ckpt = tmp_path / "dcp"
    shutil.copytree(sharded.dcp(2), ckpt)
    meta = FileSystemReader(str(ckpt)).read_metadata()
    # Garble the stored bytes of the last LoRA tensor: found only after the others are written.
    last = [i for i in meta.storage_data if "lora_B" in i.fqn and "visual" not in i.fqn][-1]
    info = meta.storage_data[last]
    with (ckpt / info.relative_path).open("r+b") as f:
        f.seek(info.offset)
        f.write(b"\xff" * info.length)
    with pytest.raises(ShardError, match="cannot load tensor") as err:
        consolidate(ckpt, tmp_path / "out", lora_alpha=16)
    assert err.value.key == last.fqn
    _assert_nothing_written(tmp_path)


def test_existing_output_needs_overwrite(sharded: Sharded, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    with pytest.raises(OutputExistsError):
        consolidate(sharded.lora(2), out, lora_alpha=16)
    assert (out / "stale.txt").exists()
    consolidate(sharded.lora(2), out, lora_alpha=16, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_config_errors(sharded: Sharded, tmp_path: Path) -> None:
    with pytest.raises(ConsolidationError, match="lora_alpha"):
        consolidate(sharded.lora(2), tmp_path / "out")
    with pytest.raises(ConsolidationError, match="adapter 'other'"):
        consolidate(sharded.lora(2), tmp_path / "out", lora_alpha=16, adapter_name="other")
    with pytest.raises(ConsolidationError, match="world size must be"):
        reshard(sharded.lora(2), tmp_path / "out", 0)
    _assert_nothing_written(tmp_path)


def test_cli_reports_the_shard_and_exits_2(
    sharded: Sharded, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = _copy_ranks(sharded.lora(2), tmp_path / "ckpt", [1], 2)
    code = main(["consolidate", str(ckpt), "--out", str(tmp_path / "out"), "--lora-alpha", "16"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("lora-consolidate: error: ")
    assert "model_world_size_2_rank_0.pt" in err
    _assert_nothing_written(tmp_path)


# ------------------------------------------------------------------------- the shard format


def _copy_shards(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_part(ckpt: Path, rank: int, edit: Callable[[dict[str, Any]], None]) -> None:
    path = ckpt / f"model_world_size_3_rank_{rank}.index.json"
    part = json.loads(path.read_text())
    edit(part)
    path.write_text(json.dumps(part))


def _row(part: dict[str, Any], name_part: str) -> list[Any]:
    return next(r for r in part["tensors"] if name_part in r[0])


LORA_A0 = "language_model.layers.0.self_attn.q_proj.lora_A"  # [8, 64] over 3 ranks: 3, 3, 2 rows


def test_shards_missing_rank(sharded: Sharded, tmp_path: Path) -> None:
    ckpt = _copy_shards(sharded.shards(3), tmp_path / "ckpt")
    (ckpt / "model_world_size_3_rank_1.index.json").unlink()
    _expect(ckpt, tmp_path, r"missing rank\(s\) \[1\]", "model_world_size_3_rank_1.index.json")
    shutil.copy(sharded.shards(3) / "model_world_size_3_rank_1.index.json", ckpt)
    (ckpt / "model_world_size_3_rank_2.safetensors").unlink()
    _expect(ckpt, tmp_path, "data file of rank 2 is missing", "model_world_size_3_rank_2")


@pytest.mark.parametrize(
    ("offset", "match"), [(2, "regions overlap: rank 1"), (4, "regions leave a gap: rows 3..4")]
)
def test_shards_overlap_or_gap(sharded: Sharded, tmp_path: Path, offset: int, match: str) -> None:
    ckpt = _copy_shards(sharded.shards(3), tmp_path / "ckpt")
    _edit_part(ckpt, 1, lambda p: _row(p, LORA_A0)[3].__setitem__(0, offset))
    err = _expect(ckpt, tmp_path, match, "ckpt")
    assert err.key is not None and LORA_A0 in err.key


def test_shards_dtype_or_shape_disagrees_with_file(sharded: Sharded, tmp_path: Path) -> None:
    ckpt = _copy_shards(sharded.shards(3), tmp_path / "ckpt")
    for rank in range(3):  # every rank's index says bf16; the files hold f32
        _edit_part(ckpt, rank, lambda p: _row(p, LORA_A0).__setitem__(1, "BF16"))
    err = _expect(
        ckpt, tmp_path, "file holds dtype F32, the index says BF16", "model_world_size_3_rank_0"
    )
    assert err.key is not None and LORA_A0 in err.key
    ckpt = _copy_shards(sharded.shards(3), tmp_path / "ckpt2")
    _edit_part(ckpt, 0, lambda p: _row(p, LORA_A0)[4].__setitem__(0, 2))
    _expect(
        ckpt, tmp_path, r"file holds shape \[3, 64\], the index says \[2, 64\]",
        "model_world_size_3_rank_0.safetensors",
    )  # fmt: skip


def test_shards_truncated_or_replaced_file(sharded: Sharded, tmp_path: Path) -> None:
    ckpt = _copy_shards(sharded.trained(2), tmp_path / "ckpt")  # with the merged index
    victim = ckpt / "model_world_size_2_rank_1.safetensors"
    victim.write_bytes(victim.read_bytes()[:-100])
    _expect(ckpt, tmp_path, "truncated or replaced", "model_world_size_2_rank_1.safetensors")


def test_shards_from_two_saves(sharded: Sharded, tmp_path: Path) -> None:
    ckpt = _copy_shards(sharded.shards(3), tmp_path / "ckpt")
    _edit_part(ckpt, 2, lambda p: p.__setitem__("tag", "other"))
    _expect(ckpt, tmp_path, "different saves", "model_world_size_3_rank_2.index.json")


def test_verify_rank_shards_catches_flipped_bytes_that_consolidation_would_copy(
    tmp_path: Path,
) -> None:
    import pickle

    from lora_consolidate.shards import data_file_name, verify_rank_shards, write_rank_shards

    state = {"m.q_proj.lora_A.default.weight": torch.arange(32.0).reshape(4, 8)}
    write_rank_shards(state, tmp_path, 0, 1)
    data = tmp_path / data_file_name("model", 1, 0)
    assert verify_rank_shards(tmp_path, 1) == [data]
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF  # inside the tensor bytes: header, sizes and tiling still agree
    data.write_bytes(bytes(raw))
    with pytest.raises(ShardError, match="checksum differs") as info:
        verify_rank_shards(tmp_path, 1)
    with pytest.raises(ShardError, match="missing rank 0 of world size 2"):
        verify_rank_shards(tmp_path, 2)
    # Picklable as raised (it crosses process boundaries, e.g. from a Ray task).
    again = pickle.loads(pickle.dumps(info.value))
    assert isinstance(again, ShardError) and str(again) == str(info.value)
    assert again.path == info.value.path
