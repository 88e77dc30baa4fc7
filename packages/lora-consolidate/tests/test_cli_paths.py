"""The CLI takes the checkpoint directory a user sees: ``ckpt/global_step_N``, not only its
``policy/``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file  # pyright: ignore[reportUnknownVariableType]

from lora_consolidate.cli import main

PREFIX = "base_model.model.model.language_model.layers.0.self_attn"


def _step_dir(root: Path) -> Path:
    """A one-rank step directory in the local engine's layout: policy/ + policy/lora_adapter/."""
    step = root / "ckpt" / "global_step_3"
    policy = step / "policy"
    (policy / "lora_adapter").mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    state = {
        f"{PREFIX}.q_proj.lora_A.default.weight": torch.randn(4, 16, generator=gen),
        f"{PREFIX}.q_proj.lora_B.default.weight": torch.randn(16, 4, generator=gen),
    }
    torch.save(state, policy / "model_world_size_1_rank_0.pt")
    config = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}
    (policy / "lora_adapter" / "adapter_config.json").write_text(json.dumps(config))
    (step / "trainer_state.pt").write_bytes(b"")  # what else a step directory holds
    return step


def test_consolidate_and_inspect_take_the_step_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    step = _step_dir(tmp_path)
    assert main(["consolidate", str(step), "--out", str(tmp_path / "from_step")]) == 0
    assert main(["consolidate", str(step / "policy"), "--out", str(tmp_path / "from_policy")]) == 0
    a = load_file(str(tmp_path / "from_step" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "from_policy" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and len(a) == 2
    assert all(torch.equal(a[k], b[k]) for k in a)
    config = json.loads((tmp_path / "from_step" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8
    capsys.readouterr()
    assert main(["inspect", str(step)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"rank-files checkpoint at {step / 'policy'}, world size 1")


def test_a_directory_without_shards_is_still_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty" / "policy").mkdir(parents=True)
    assert main(["inspect", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lora-consolidate: error: ") and len(err.splitlines()) == 1
