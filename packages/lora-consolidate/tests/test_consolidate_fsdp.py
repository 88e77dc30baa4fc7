"""Consolidation of real FSDP2 checkpoints (per-rank DTensor files and DCP) against the unsharded
peft model: names and bytes must equal ``get_peft_model_state_dict``; logits must match."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import Reference, Sharded, peft_logits
from safetensors.torch import load_file  # pyright: ignore[reportUnknownVariableType]

from lora_consolidate import consolidate
from lora_consolidate.cli import main
from lora_consolidate.keys import is_vision_key


def _lm_only(adapter: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in adapter.items() if not is_vision_key(k)}


def _assert_bit_exact(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype, key
        assert torch.equal(got[key], value), key


@pytest.mark.parametrize(
    ("layout", "world"), [("full", 2), ("lora", 2), ("dcp", 2), ("full", 3), ("dcp", 3)]
)
def test_matches_peft_state_dict_bit_exact(
    sharded: Sharded, reference: Reference, tmp_path: Path, layout: str, world: int
) -> None:
    src = getattr(sharded, layout)(world)
    config = sharded.full(world) / "lora_adapter" / "adapter_config.json"
    result = consolidate(src, tmp_path / "adapter", adapter_config=config)
    got = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    _assert_bit_exact(got, _lm_only(reference.adapter))
    assert result.tensors == len(got)
    assert result.vision_tensors_skipped == len(reference.adapter) - len(got) > 0
    assert result.source_kind == ("dcp" if layout == "dcp" else "rank-files")


def test_include_vision_keeps_vision_tower(
    sharded: Sharded, reference: Reference, tmp_path: Path
) -> None:
    consolidate(sharded.full(2), tmp_path / "a", include_vision=True)
    got = load_file(tmp_path / "a" / "adapter_model.safetensors")
    _assert_bit_exact(got, reference.adapter)
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert config["exclude_modules"] is None


def test_peft_loads_adapter_and_logits_match(
    sharded: Sharded, reference: Reference, tmp_path: Path
) -> None:
    # The config is found beside policy/ (SkyRL layout), vision LoRA is dropped and excluded.
    consolidate(sharded.full(2), tmp_path / "adapter", base_model_name="tiny-qwen3-vl")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["exclude_modules"] == r".*visual.*"
    assert config["base_model_name_or_path"] == "tiny-qwen3-vl"
    logits = peft_logits(reference.base_dir, tmp_path / "adapter", reference.input_ids)
    # Text-only input never reaches the vision tower, so dropping its LoRA changes nothing.
    torch.testing.assert_close(logits, reference.logits, rtol=0, atol=1e-6)
    # ... and the adapter does matter: the base model alone gives other logits.
    from transformers import Qwen3VLForConditionalGeneration

    base = Qwen3VLForConditionalGeneration.from_pretrained(str(reference.base_dir)).eval()
    with torch.no_grad():
        base_logits = base(input_ids=reference.input_ids).logits
    assert (base_logits - reference.logits).abs().max() > 1e-2


def test_cli_infers_config_from_shards(
    sharded: Sharded, reference: Reference, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli-adapter"
    code = main(["consolidate", str(sharded.lora(2)), "--out", str(out), "--lora-alpha", "16",
                 "--dtype", "bfloat16"])  # fmt: skip
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["world_size"] == 2
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 8
    assert config["lora_alpha"] == 16
    assert config["target_modules"] == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    got = load_file(out / "adapter_model.safetensors")
    want = {k: v.to(torch.bfloat16) for k, v in _lm_only(reference.adapter).items()}
    _assert_bit_exact(got, want)


def test_cli_merge_writes_single_model_dir(
    sharded: Sharded, reference: Reference, tmp_path: Path
) -> None:
    # A real `lora-consolidate` process, as an operator runs it on the head node.
    out = tmp_path / "merged"
    proc = subprocess.run(
        [sys.executable, "-m", "lora_consolidate.cli", "consolidate", str(sharded.full(2)),
         "--merge", str(reference.base_dir), "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["merged_modules"] == 14
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]  # no leftovers
    from transformers import Qwen3VLForConditionalGeneration

    merged = Qwen3VLForConditionalGeneration.from_pretrained(str(out)).eval()
    with torch.no_grad():
        logits = merged(input_ids=reference.input_ids).logits
    torch.testing.assert_close(logits, reference.logits, rtol=0, atol=1e-4)
