import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from maze_engine.checkpoint import (
    LATEST_FILE,
    CheckpointManager,
    TrainState,
    rank_file,
    read_train_state,
    write_train_state,
)
from maze_engine.errors import CheckpointError
from maze_policy.contexts import read_context, write_context


def _writer(payload: bytes):
    def write(d: Path) -> None:
        (d / "policy").mkdir()
        (d / rank_file("model")).write_bytes(payload)
        (d / "trainer_state.pt").write_bytes(b"state")

    return write


def test_layout_latest_pointer_and_retention(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, max_ckpts_to_keep=2)
    for step in (1, 2, 3):
        ckpt = mgr.save(step, _writer(f"weights-{step}".encode()))
        assert ckpt.path == tmp_path / f"global_step_{step}"
        assert (ckpt.path / "policy" / "model_world_size_1_rank_0.pt").exists()
        assert (tmp_path / LATEST_FILE).read_text().strip() == str(step)
    assert mgr.steps() == [3, 2]
    latest = mgr.latest_valid()
    assert latest is not None and latest.step == 3
    with pytest.raises(CheckpointError, match="never overwritten"):
        mgr.save(3, _writer(b"x"))


def test_corrupt_newest_falls_back_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, _writer(b"one"))
    mgr.save(2, _writer(b"two"))
    (tmp_path / "global_step_2" / rank_file("model")).write_bytes(b"tw0")  # same size, other bytes
    with caplog.at_level(logging.WARNING):
        latest = mgr.latest_valid()
    assert latest is not None and latest.step == 1
    assert "global_step_2" in caplog.text and "sha256" in caplog.text
    (tmp_path / "global_step_1" / "trainer_state.pt").unlink()
    assert mgr.latest_valid() is None


def test_writer_failure_leaves_nothing(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)

    def boom(d: Path) -> None:
        (d / "partial").write_bytes(b"x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        mgr.save(5, boom)
    assert list(tmp_path.iterdir()) == []


def test_resume_modes(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    assert mgr.resolve("latest") is None
    mgr.save(4, _writer(b"four"))
    assert mgr.resolve("none") is None
    got = mgr.resolve("from_path", tmp_path / "global_step_4")
    assert got is not None and got.step == 4
    with pytest.raises(CheckpointError, match="resume_path"):
        mgr.resolve("from_path")
    with pytest.raises(CheckpointError, match="latest, none, from_path"):
        mgr.resolve("sometimes")


def test_sigkill_mid_write_never_yields_a_torn_checkpoint(tmp_path: Path) -> None:
    # A child writes checkpoints of growing size in a loop and is killed at once; whatever is
    # left, latest_valid() is a checkpoint whose every file verifies, and staging is pruned.
    script = textwrap.dedent(
        f"""
        import os, sys
        from pathlib import Path
        from maze_engine.checkpoint import CheckpointManager
        mgr = CheckpointManager(Path({str(tmp_path)!r}))
        step = 0
        def write(d):
            (d / "policy").mkdir()
            (d / "policy" / "model_world_size_1_rank_0.pt").write_bytes(os.urandom(1 << 20))
        while True:
            step += 1
            mgr.save(step, write)
            print(step, flush=True)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for _ in range(3):
        proc.stdout.readline()
    proc.kill()
    proc.wait(timeout=30)
    mgr = CheckpointManager(tmp_path)
    latest = mgr.latest_valid()
    assert latest is not None and latest.step >= 3
    mgr.verify(latest.path)
    mgr.prune()
    assert not [p for p in os.listdir(tmp_path) if "staging" in p]


_LORA = "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_{}.default.weight"


def test_train_state_round_trips_in_skyrls_layout_and_restores_the_rngs(tmp_path: Path) -> None:
    lora = {_LORA.format("A"): torch.randn(2, 8), _LORA.format("B"): torch.randn(8, 2)}
    state = TrainState(
        lora=lora,
        optimizer={"state": {}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]},
        scheduler={"last_epoch": 3},
        loader={"epoch": 1, "position": 2, "seed": 0, "size": 8},
        global_step=3,
        history=[{"global_step": 3.0, "policy/loss": 0.5}],
        eval_before=0.25,
    )
    adapter_config = {
        "peft_type": "LORA",
        "r": 2,
        "lora_alpha": 4,
        "target_modules": ["q_proj"],
        "base_model_name_or_path": "tiny",
    }
    mgr = CheckpointManager(tmp_path)
    torch.manual_seed(123)
    np.random.seed(123)
    ckpt = mgr.save(
        3,
        lambda d: write_train_state(
            d,
            state,
            adapter_config=adapter_config,
            describe_adapter=lambda a: write_context(a, "route"),
        ),
    )
    mgr.verify(ckpt.path)
    # The adapter's records are written before the manifest, which vouches for them too.
    assert read_context(ckpt.path / "policy" / "lora_adapter") == "route"
    manifest = json.loads((ckpt.path / "manifest.json").read_text())
    assert "policy/lora_adapter/maze_context.json" in manifest["files"]
    for rel in (rank_file("model"), rank_file("optim"), rank_file("extra_state")):
        assert (ckpt.path / rel).is_file()
    assert (ckpt.path / "data.pt").is_file() and (ckpt.path / "trainer_state.pt").is_file()
    assert (ckpt.path / "policy" / "lora_adapter" / "adapter_model.safetensors").is_file()
    torch.manual_seed(123)
    np.random.seed(123)
    expected = (torch.rand(3), np.random.rand(3))
    torch.manual_seed(0)
    np.random.seed(0)

    got = read_train_state(ckpt.path, list(lora))
    assert torch.equal(torch.rand(3), expected[0])  # the RNGs continue from the checkpoint
    assert np.array_equal(np.random.rand(3), expected[1])
    assert got.lora.keys() == lora.keys()
    assert all(torch.equal(got.lora[k], v) for k, v in lora.items())
    assert (got.optimizer, got.scheduler, got.loader) == (
        state.optimizer,
        state.scheduler,
        state.loader,
    )
    assert (got.global_step, got.history, got.eval_before) == (3, state.history, 0.25)
    with pytest.raises(CheckpointError, match=r"lacks LoRA parameters such as other\.lora_A"):
        read_train_state(ckpt.path, [*lora, "other.lora_A.weight"])
