"""Session fixtures: one real FSDP2 run (2 ranks, then 3 ranks resuming from a reshard, in both the
.pt and the shard format) and the unsharded reference model it must agree with."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import torch

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))


@dataclass(frozen=True)
class Sharded:
    root: Path

    def full(self, world: int) -> Path:
        return self.root / f"w{world}" / "full"

    def lora(self, world: int) -> Path:
        return self.root / f"w{world}" / "lora"

    def dcp(self, world: int) -> Path:
        return self.root / f"w{world}" / "dcp"

    def shards(self, world: int) -> Path:
        """The untrained LoRA weights in the shard format (parts only, no merged index)."""
        return self.root / f"w{world}" / "shards"

    def trained(self, world: int) -> Path:
        """After one AdamW step: weights and optimizer state as shards, merged index."""
        return self.root / f"w{world}" / "trained"

    def trained_full(self, world: int) -> Path:
        """The gathered (unsharded) values of ``trained``."""
        return self.root / f"w{world}" / "trained_full.pt"

    @property
    def resharded(self) -> Path:
        return self.root / "resharded"

    @property
    def resharded_shards(self) -> Path:
        """``trained(2)`` resharded to 3 ranks (weights and optimizer state)."""
        return self.root / "resharded-shards"

    @property
    def resumed(self) -> Path:
        return self.root / "w3" / "resumed.pt"

    @property
    def resumed_shards(self) -> Path:
        """What a 3-rank FSDP job held after loading ``resharded_shards``, gathered."""
        return self.root / "w3" / "resumed_shards.pt"


@pytest.fixture(scope="session")
def _fsdp_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    # Started early and in the background: the reference model is built while it runs.
    root = tmp_path_factory.mktemp("fsdp")
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "fsdp_writer.py"), str(root), "2", "3", "--reshard-to-next"]
    )
    yield root, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def sharded(_fsdp_run: tuple[Path, subprocess.Popen[bytes]], reference: Reference) -> Sharded:
    root, proc = _fsdp_run
    assert proc.wait(timeout=400) == 0, "FSDP writer failed"
    return Sharded(root)


@dataclass(frozen=True)
class Reference:
    model: Any  # the unsharded peft model
    adapter: dict[str, torch.Tensor]  # peft.get_peft_model_state_dict (vision included)
    logits: torch.Tensor
    input_ids: torch.Tensor
    base_dir: Path  # the base model, save_pretrained


@pytest.fixture(scope="session")
def reference(
    _fsdp_run: tuple[Path, subprocess.Popen[bytes]], tmp_path_factory: pytest.TempPathFactory
) -> Reference:
    from peft import get_peft_model_state_dict  # pyright: ignore[reportUnknownVariableType]
    from tiny_qwen3vl import build_base, build_peft, sample_input_ids

    model = build_peft(seed=0, include_vision=True)
    ids = sample_input_ids()
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    base_dir = tmp_path_factory.mktemp("base")
    build_base(seed=0).save_pretrained(str(base_dir))
    state = cast(dict[str, torch.Tensor], get_peft_model_state_dict(model))
    adapter = {k: v.detach().clone() for k, v in state.items()}
    return Reference(model, adapter, logits, ids, base_dir)


def peft_logits(base_dir: Path, adapter_dir: Path, input_ids: torch.Tensor) -> torch.Tensor:
    """Load base + adapter the way a server or evaluator would, and run a forward pass."""
    from peft import PeftModel
    from transformers import Qwen3VLForConditionalGeneration

    base = Qwen3VLForConditionalGeneration.from_pretrained(str(base_dir))
    model = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    with torch.no_grad():
        return model(input_ids=input_ids).logits
