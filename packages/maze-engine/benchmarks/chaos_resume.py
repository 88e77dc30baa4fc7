"""Chaos test: 20 random SIGKILLs of a training run, each followed by a resume.

The final adapter is compared with an uninterrupted run of the same config and seed::

    uv run python packages/maze-engine/benchmarks/chaos_resume.py --kills 20

One attempt in five is killed during start-up (uniform over the first half of the start-up time
measured on the uninterrupted run); the others once they have logged their first new step, plus
0-1.5 of the mean step time, so kills land in rollout, update and checkpoint writes while the run
still advances about a step per attempt, however slow start-up is on a loaded machine. Times are
drawn from --seed. Killing stops once --kills is reached or the run completes first (the count
actually made is printed). Prints each kill, the restarts, and whether the adapters are equal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

RUNNER = (
    "import sys\n"
    "from maze_engine.config import load_config\n"
    "from maze_engine.trainer import train\n"
    "train(load_config('smoke_5x5', sys.argv[1:]), say=lambda m: None)\n"
)


def overrides(run: Path, base: Path, steps: int) -> list[str]:
    """The ``smoke_5x5`` overrides of every run: short, in-process, checkpointing each step."""
    return [
        f"trainer.export_path={run}",
        f"trainer.policy.model.path={base}",
        f"trainer.max_training_steps={steps}",
        "trainer.train_batch_size=2",
        "trainer.policy_mini_batch_size=2",
        "generator.n_samples_per_prompt=2",
        "generator.sampling_params.max_generate_length=12",
        "trainer.ckpt_interval=1",
        "trainer.eval_interval=0",
        "trainer.eval_before_train=false",
        "trainer.policy.optimizer_config.lr=0.01",
        "local.rollout_workers=0",
        "mazes.train_size=16",
        "local.progress=false",
        "local.tensorboard=false",
        "mazes.reward_spec=visgym_sft",
        # Format credit varies across samples of a barely warm-started model, so advantages are
        # nonzero and the adapter really moves between checkpoints (checked below).
    ]


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def digest(run: Path) -> str:
    """sha256 of a run's final adapter weights."""
    return hashlib.sha256(
        (run / "final_adapter" / "adapter_model.safetensors").read_bytes()
    ).hexdigest()


def main() -> None:
    """Run the reference, then kill and resume until done; exit 0 if the adapters match."""
    p = argparse.ArgumentParser()
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dir", type=Path, default=Path("runs/chaos"))
    args = p.parse_args()
    from maze_engine.config import load_config
    from maze_engine.trainer import base_model_dir, prepare_data

    shutil.rmtree(args.dir / "reference", ignore_errors=True)
    shutil.rmtree(args.dir / "killed", ignore_errors=True)
    # A barely warm-started tiny model under DIR/base_model (reused by later invocations).
    base_config = load_config(
        "smoke_5x5",
        [
            f"trainer.export_path={args.dir}",
            "trainer.eval_before_train=false",
            "mazes.train_size=16",
            "local.warm_start.steps=3",
            "local.progress=false",
        ],
    )
    base = base_model_dir(base_config, prepare_data(base_config), print)
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", RUNNER, *overrides(args.dir / "reference", base, args.steps)],
        check=True,
    )
    ref_seconds = time.perf_counter() - t0
    lines = (args.dir / "reference" / "metrics.jsonl").read_text().splitlines()
    step_times = [float(r["timing/step"]) for r in map(json.loads, lines) if "timing/step" in r]
    step_s = sum(step_times) / len(step_times)
    startup_s = max(0.0, ref_seconds - sum(step_times))
    print(
        f"uninterrupted run: {ref_seconds:.1f} s (start-up {startup_s:.1f} s, mean step "
        f"{step_s:.2f} s), adapter sha256 {digest(args.dir / 'reference')[:16]}"
    )
    rng = random.Random(args.seed)
    run = args.dir / "killed"
    kills = restarts = 0
    started = time.perf_counter()
    while True:
        restarts += 1
        proc = subprocess.Popen([sys.executable, "-c", RUNNER, *overrides(run, base, args.steps)])
        if kills < args.kills:
            # Resumed attempts redo start-up, then only the remaining steps.
            metrics = run / "metrics.jsonl"
            if rng.random() < 0.2:
                delay = rng.uniform(0.0, 0.5) * startup_s
                when = f"in start-up after {delay:.1f} s"
                deadline = time.perf_counter() + delay
            else:
                lines0 = _lines(metrics)
                extra = rng.uniform(0.0, 1.5) * step_s
                while proc.poll() is None and _lines(metrics) <= lines0:
                    time.sleep(0.05)
                when = f"{extra:.1f} s after its first new step"
                deadline = time.perf_counter() + extra
            try:
                proc.wait(timeout=max(0.0, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                kills += 1
                latest = run / "ckpt" / "latest_ckpt_global_step.txt"
                step = latest.read_text().strip() if latest.exists() else "-"
                print(f"kill {kills:>2} {when} (latest checkpoint: step {step})", flush=True)
                continue
        else:
            proc.wait()
        if proc.returncode == 0:
            break
        raise SystemExit(f"run failed with exit code {proc.returncode}")
    same = digest(run) == digest(args.dir / "reference")
    step1 = args.dir / "reference" / "ckpt" / "global_step_1" / "policy" / "lora_adapter"
    changed = hashlib.sha256(
        (step1 / "adapter_model.safetensors").read_bytes()
    ).hexdigest() != digest(args.dir / "reference")
    print(f"adapter changed during training (step 1 vs final): {changed}")
    print(f"kills: {kills}, starts: {restarts}, total {time.perf_counter() - started:.1f} s")
    print(f"final adapter bit-identical to the uninterrupted run: {same}")
    raise SystemExit(0 if same and changed else 1)


if __name__ == "__main__":
    main()
