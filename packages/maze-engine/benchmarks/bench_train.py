"""Throughput of the local engine on its default config, from the trainer's own metrics.

Rollout turns/s, tokens/s and update time per GRPO step (SkyRL's metric names)::

    uv run python packages/maze-engine/benchmarks/bench_train.py --steps 6

Builds (or reuses) the warm-started tiny model under --run, trains --steps steps with the
shipped ``smoke_5x5`` config plus any key=value overrides, and prints the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from maze_engine.config import load_config
from maze_engine.trainer import train


def main() -> None:
    """Train ``--steps`` steps and print the median figures."""
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--run", type=Path, default=Path("runs/bench-train"))
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    overrides = [
        f"trainer.export_path={args.run}",
        f"trainer.max_training_steps={args.steps}",
        "trainer.resume_mode=none",
        "trainer.eval_before_train=false",
        "trainer.eval_interval=0",
        "trainer.ckpt_interval=0",
        "local.progress=false",
        *args.overrides,
    ]
    config = load_config("smoke_5x5", overrides)
    # A fresh run each time: drop earlier checkpoints and adapter versions, keep the base model.
    for sub in ("ckpt", "lora_sync", "metrics.jsonl"):
        target = args.run / sub
        if target.is_dir():
            import shutil

            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    t0 = time.perf_counter()
    result = train(config, say=lambda m: print(m, flush=True))
    wall = time.perf_counter() - t0
    rows = [
        json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in rows if "timing/step" in r][1:]  # the first step warms caches
    med = {
        k: statistics.median(r[k] for r in steps)
        for k in (
            "rollout/turns_per_second",
            "rollout/tokens_per_second",
            "timing/generate",
            "timing/policy_train",
            "timing/sync_weights",
            "timing/step",
        )
    }
    print(f"config: smoke_5x5 {' '.join(args.overrides)}  workers={config.local.rollout_workers}")
    print(
        f"steps measured: {len(steps)} (of {args.steps}; first excluded), wall incl. start-up {wall:.1f} s"
    )
    for k, v in med.items():
        print(f"{k:<28}{v:>10.2f}")


if __name__ == "__main__":
    main()
