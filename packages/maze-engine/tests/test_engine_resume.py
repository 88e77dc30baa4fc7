"""Kill-and-resume is exact: SIGKILL at several points, restart with resume_mode=latest, and the
final adapter is bit-identical to an uninterrupted run with the same seed (CPU, deterministic)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from maze_engine.faults import FAULT_ENV

RUNNER = textwrap.dedent(
    """
    import sys
    from maze_engine.config import load_config
    from maze_engine.trainer import train
    train(load_config("smoke_5x5", sys.argv[1:]), say=lambda m: print(m, flush=True))
    """
)
STEPS = 3


def _overrides(run: Path, base: Path) -> list[str]:
    return [
        f"trainer.export_path={run}",
        f"trainer.policy.model.path={base}",
        f"trainer.max_training_steps={STEPS}",
        "trainer.train_batch_size=2",
        "trainer.policy_mini_batch_size=2",
        "generator.n_samples_per_prompt=2",
        "generator.sampling_params.max_generate_length=12",
        "trainer.ckpt_interval=1",
        "trainer.eval_interval=0",
        "trainer.eval_before_train=false",
        "trainer.policy.optimizer_config.lr=0.01",
        # A decaying rate: a resume that lost the schedule's position would not repeat the run.
        "trainer.policy.optimizer_config.scheduler=cosine",
        "local.rollout_workers=0",
        "mazes.train_size=8",
        "local.progress=false",
        "local.tensorboard=false",
        # Partial format credit varies across samples, so advantages (and updates) are nonzero.
        "mazes.reward_spec=visgym_sft",
    ]


def _run(run: Path, base: Path, fault: str | None = None) -> int:
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    if fault:
        env[FAULT_ENV] = fault
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, *_overrides(run, base)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode not in (0, -9):
        raise AssertionError(
            f"trainer failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc.returncode


def test_sigkill_at_rollout_update_and_checkpoint_then_resume_is_bit_identical(
    base_model: Path, tmp_path: Path
) -> None:
    ref = tmp_path / "reference"
    assert _run(ref, base_model) == 0
    reference = (ref / "final_adapter" / "adapter_model.safetensors").read_bytes()

    run = tmp_path / "killed"
    faults = ["rollout@2", "checkpoint@2", "update@3"]
    for fault in faults:
        assert _run(run, base_model, fault) == -9, f"fault {fault} did not fire"
    assert _run(run, base_model) == 0
    resumed = (run / "final_adapter" / "adapter_model.safetensors").read_bytes()
    assert resumed == reference

    # The adapter did change during training, so the comparison is not between two no-ops.
    first = ref / "ckpt" / "global_step_1" / "policy" / "lora_adapter" / "adapter_model.safetensors"
    assert first.read_bytes() != reference
    assert (ref / "ckpt" / "latest_ckpt_global_step.txt").read_text().strip() == str(STEPS)
    # The checkpoint torn by the kill inside its write left no staging behind once resumed.
    assert not [p for p in (run / "ckpt").iterdir() if "staging" in p.name]
