import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


def run(*args: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "maze_trainer.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_dry_run_prints_the_resolved_config() -> None:
    proc = run("--dry-run", "generator.n_samples_per_prompt=3")
    assert proc.returncode == 0, proc.stderr
    assert "n_samples_per_prompt: 3" in proc.stdout and "local: LocalConfig(" in proc.stdout


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("trainer.bogus=1", "trainer.bogus"),
        ("local.bogus=1", "local.bogus"),
        ("local.eval_set=nope", "local.eval_set"),
        ("trainer.resume_mode=sometimes", "resume_mode"),
        # tiny-64's mazes need 4 moves + stop: fewer turns would leave them unsolvable.
        ("generator.max_turns=4", "generator.max_turns: 4 turns cannot finish"),
        ("local.sft_mazes=512", "local.sft_mazes"),
    ],
)
def test_config_errors_name_the_key(override: str, needle: str) -> None:
    proc = run("--dry-run", override)
    assert proc.returncode == 2
    assert needle in proc.stderr and "maze-train: config error" in proc.stderr


def test_changed_settings_for_an_existing_run_directory_are_a_config_error(tmp_path: Path) -> None:
    from maze_engine.config import LocalConfig
    from maze_engine.skyrl_cluster import load_config
    from maze_engine.trainer import export_data

    cfg, local = load_config("tiny_local", [f"trainer.export_path={tmp_path}"])
    export_data(cfg, LocalConfig.from_dict(local), tmp_path / "data")
    proc = run(f"trainer.export_path={tmp_path}", "local.train_preset=7x7")
    assert proc.returncode == 2, proc.stderr
    assert "maze-train: config error: local.train_preset is '7x7'" in proc.stderr


def test_not_an_override() -> None:
    proc = run("stray")
    assert proc.returncode == 2 and "key=value" in proc.stderr


def test_skyrl_engine_validates_and_needs_the_gpu_image() -> None:
    proc = run("--engine", "skyrl", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "Qwen3-VL-8B" in proc.stdout
    proc = run("--engine", "skyrl")
    assert proc.returncode == 3 and "GPU container image" in proc.stderr
    proc = run("--engine", "skyrl", "--submit", "sagemaker_ray://maze-cluster/default", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert (
        proc.stdout.startswith("ray job submit")
        and "sagemaker_ray://maze-cluster/default" in proc.stdout
    )


def test_short_local_run_trains_checkpoints_and_reports(tmp_path: Path) -> None:
    proc = run(
        f"trainer.export_path={tmp_path}",
        "trainer.max_training_steps=1",
        "trainer.train_batch_size=2",
        "trainer.policy_mini_batch_size=2",
        "generator.n_samples_per_prompt=2",
        "generator.sampling_params.max_generate_length=8",
        "trainer.ckpt_interval=1",
        "trainer.eval_interval=0",
        "trainer.eval_before_train=true",
        "local.slack=0",
        "local.sft_steps=2",
        "local.rollout_workers=0",
        "local.train_size=4",
        "local.progress=false",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "final adapter:" in proc.stdout
    # The three stages of the main job, each figure the one its run recorded.
    m = re.search(
        r"tiny-64 solve rate: random init ([\d.]+)% -> warm start \(2 oracle steps\) "
        r"([\d.]+)% -> GRPO ([\d.]+)% \(global step 1\)",
        proc.stdout,
    )
    assert m, proc.stdout
    report = json.loads((tmp_path / "base_model" / "sft_report.json").read_text())
    assert float(m[1]) == pytest.approx(100 * report["random_init_solve_rate"], abs=0.005)
    evals = [
        json.loads(line)["eval/all/pass_at_1"]
        for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
        if "eval/all/pass_at_1" in line
    ]
    assert [float(m[2]), float(m[3])] == pytest.approx([100 * e for e in evals], abs=0.005)
    assert (tmp_path / "final_adapter" / "adapter_model.safetensors").exists()
    assert (
        tmp_path / "ckpt" / "global_step_1" / "policy" / "lora_adapter" / "adapter_config.json"
    ).exists()
    assert (tmp_path / "ckpt" / "latest_ckpt_global_step.txt").read_text().strip() == "1"
    assert (tmp_path / "metrics.jsonl").read_text().count("reward/avg_raw_reward") == 1


def test_ray_rollout_workers_from_a_relative_run_dir(tmp_path: Path) -> None:
    """Two Ray actors on a local Ray instance generate the rollouts and load each published
    adapter; paths in the config are relative to the caller's directory, as with the default
    ``./runs/...``, and must still resolve inside the workers."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": ""}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "maze_trainer.cli",
            "trainer.export_path=./runs/ray-test",
            "trainer.max_training_steps=2",
            "trainer.train_batch_size=2",
            "trainer.policy_mini_batch_size=2",
            "generator.n_samples_per_prompt=2",
            "generator.sampling_params.max_generate_length=8",
            "trainer.ckpt_interval=2",
            "trainer.eval_interval=0",
            "trainer.eval_before_train=false",
            "local.sft_steps=2",
            "local.rollout_workers=2",
            "local.train_size=4",
            "local.progress=false",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "runs" / "ray-test"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/turns_per_second" in r]
    # Version 1 is the initial adapter the workers start from; each step publishes the next one
    # and the workers load it before the following step's rollouts.
    assert [r["adapter/version"] for r in steps] == [2.0, 3.0]
    assert all(r["rollout/avg_turns"] >= 1 for r in steps)
    assert (run_dir / "final_adapter" / "adapter_model.safetensors").is_file()
