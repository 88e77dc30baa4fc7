"""Reshard 2 -> 3 (resumed by a real 3-rank FSDP2 job) -> 1, bit-exact throughout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import Reference, Sharded
from safetensors.torch import load_file  # pyright: ignore[reportUnknownVariableType]

from lora_consolidate import consolidate, open_checkpoint, reshard
from lora_consolidate.cli import main


def test_fsdp_resumes_from_resharded_files(sharded: Sharded, reference: Reference) -> None:
    # fsdp_writer resharded the 2-rank checkpoint to 3 ranks; a 3-rank FSDP2 job built a model
    # from another seed, load_state_dict'ed its rank file and gathered the LoRA weights.
    resumed = torch.load(sharded.resumed, weights_only=True)
    want = {k: v for k, v in reference.model.state_dict().items() if "lora_" in k}
    assert sorted(resumed["lora"]) == sorted(want)
    for key, value in want.items():
        assert torch.equal(resumed["lora"][key], value), key
    torch.testing.assert_close(resumed["logits"], reference.logits, rtol=0, atol=1e-5)


def test_round_trip_2_to_3_to_1_is_bit_exact(
    sharded: Sharded, reference: Reference, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "w1"
    assert main(["reshard", str(sharded.resharded), "--world-size", "1", "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["source_world_size"] == 3
    assert [p.name for p in out.iterdir()] == ["model_world_size_1_rank_0.pt"]
    unsharded = reference.model.state_dict()
    with open_checkpoint(sharded.full(2)) as w2, open_checkpoint(out) as w1:
        assert w1.world_size == 1
        assert w1.specs() == w2.specs()
        assert sorted(s.name for s in w1.specs()) == sorted(unsharded)
        for spec in w2.specs():
            assert torch.equal(w1.read(spec.name), w2.read(spec.name)), spec.name
            assert torch.equal(w1.read(spec.name), unsharded[spec.name]), spec.name


def test_reshard_dcp_lora_only_then_consolidate(
    sharded: Sharded, reference: Reference, tmp_path: Path
) -> None:
    result = reshard(sharded.dcp(3), tmp_path / "w2", 2, lora_only=True)
    assert result.world_size == 2
    assert result.tensors == len(reference.adapter)
    consolidate(tmp_path / "w2", tmp_path / "adapter", lora_alpha=16, include_vision=True)
    got = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert sorted(got) == sorted(reference.adapter)
    for key, value in reference.adapter.items():
        assert torch.equal(got[key], value), key


def test_cli_inspect_lists_global_shapes(
    sharded: Sharded, reference: Reference, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", str(sharded.dcp(3))]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dcp checkpoint")
    unsharded = reference.model.state_dict()
    assert f"{len(unsharded)} tensors" in out
    key = "base_model.model.model.language_model.layers.0.self_attn.k_proj.lora_B.default.weight"
    assert f"  {key}  {list(unsharded[key].shape)}  float32" in out
