"""Ray rollout workers' start: time to the first rollout beside ``ray.init`` alone.

    uv run python packages/maze-engine/benchmarks/bench_ray_start.py [--rounds 2] [--workers 2]
        [--compare-uv-hook]

Run it under ``uv run`` (not ``--no-sync``) to see what the trainer sees under ``uv run``: there
Ray's uv integration would start every worker with ``uv run`` inside a shipped copy of the
project. Each round, in one process: ``ray.init`` alone (the engine's options) and shut down;
then the engine's :class:`~maze_engine.trainer.Rollouts` (``init_ray`` + the worker actors,
each loading the tiny model) up to the first finished rollout, and shut down. With
``--compare-uv-hook`` each round also times the same start with Ray's uv integration left on
(what the engine did before ``init_ray``: the project shipped, each worker under ``uv run``).
Also printed: where the workers' Python is and whether Ray shipped a working_dir package.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _first_rollout(rollouts: Any, rows: list[dict[str, Any]]) -> None:
    from maze_policy.sampling import SamplingParams

    # One short episode per worker: the start-up, not generation speed, is being measured.
    n = len(rollouts.workers)
    rollouts.run(
        rows[:n],
        list(range(n)),
        list(range(n)),
        SamplingParams(greedy=True, max_new_tokens=8),
        0,
        max_turns=1,
    )


def _worker_facts(rollouts: Any) -> tuple[str, str]:
    import ray

    def facts() -> tuple[str, str]:
        return sys.executable, os.getcwd()

    return ray.get(ray.remote(num_cpus=0)(facts).remote())


_HOOK_CHILD = """
import json, logging, sys, tempfile, time
from pathlib import Path
import ray
from maze_engine.config import load_config
from maze_engine.trainer import Rollouts, prepare_data
from maze_engine.workers import lora_config_from_skyrl
from maze_policy.model import TinyVLMConfig, build_tiny_vlm
sys.path.insert(0, sys.argv[2])
from bench_ray_start import _first_rollout, _worker_facts
with tempfile.TemporaryDirectory() as tmp:
    run = Path(tmp)
    cfg = load_config("smoke_5x5", [f"trainer.export_path={run}", f"local.rollout_workers={sys.argv[1]}"])
    rows = prepare_data(cfg).validation
    build_tiny_vlm(run / "model", seed=0, config=TinyVLMConfig(**cfg.local.tiny_model))
    (run / "sync").mkdir()
    t0 = time.perf_counter()
    ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    lora = lora_config_from_skyrl(cfg.skyrl.trainer.policy.model.lora)
    rollouts = Rollouts(run / "model", lora, cfg.local, run / "sync")
    _first_rollout(rollouts, rows)
    took = time.perf_counter() - t0
    where = _worker_facts(rollouts)[0]
    rollouts.close()
    ray.shutdown()
print(json.dumps([took, where]))
"""


def _hook_round(workers: int) -> tuple[float, str]:
    """One start with Ray's uv integration on, in a fresh ``uv run`` driver."""
    import json
    import subprocess

    here = str(Path(__file__).resolve().parent)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_UV_RUN_RUNTIME_ENV"}
    out = subprocess.run(
        ["uv", "run", "python", "-c", _HOOK_CHILD, str(workers), here],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=900,
    )
    took, where = json.loads(out.stdout.strip().splitlines()[-1])
    return float(took), str(where)


def main(argv: list[str] | None = None) -> int:
    """Print ``ray.init`` alone and time to first rollout, per round and median."""
    p = argparse.ArgumentParser(description="time to first rollout beside ray.init alone")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--compare-uv-hook",
        action="store_true",
        help="also time the start with Ray's uv integration on (needs `uv`; syncs as `uv run`)",
    )
    args = p.parse_args(argv)

    import ray

    from maze_engine.config import load_config
    from maze_engine.trainer import Rollouts, init_ray, prepare_data
    from maze_engine.workers import lora_config_from_skyrl
    from maze_policy.model import TinyVLMConfig, build_tiny_vlm

    with tempfile.TemporaryDirectory(prefix="ray-start-bench-") as tmp:
        run = Path(tmp)
        config = load_config(
            "smoke_5x5",
            [f"trainer.export_path={run}", f"local.rollout_workers={args.workers}"],
        )
        rows = prepare_data(config).validation
        model_dir = run / "model"
        build_tiny_vlm(model_dir, seed=0, config=TinyVLMConfig(**config.local.tiny_model))
        lora_cfg = lora_config_from_skyrl(config.skyrl.trainer.policy.model.lora)
        sync_root = run / "lora_sync"
        sync_root.mkdir()

        init_s: list[float] = []
        first_s: list[float] = []
        hook_s: list[float] = []
        facts = ("?", "?")
        hook_facts = ("?", "?")
        for r in range(args.rounds):
            if args.compare_uv_hook:
                # The engine's start as it was (Ray's uv integration on), in its own `uv run`
                # process: a second Ray session in one driver after such a one can hang.
                t_hook, where = _hook_round(args.workers)
                hook_s.append(t_hook)
                hook_facts = (where, "")
                print(f"round {r + 1}: with the uv hook, first rollout {t_hook:.2f} s")
            t0 = time.perf_counter()
            init_ray()
            init_s.append(time.perf_counter() - t0)
            ray.shutdown()

            t0 = time.perf_counter()
            rollouts = Rollouts(model_dir, lora_cfg, config.local, sync_root)
            _first_rollout(rollouts, rows)
            first_s.append(time.perf_counter() - t0)
            if r == 0:
                facts = _worker_facts(rollouts)
            rollouts.close()
            ray.shutdown()
            print(f"round {r + 1}: ray.init {init_s[-1]:.2f} s, first rollout {first_s[-1]:.2f} s")

    under_uv = "uv run" if os.environ.get("UV") or os.environ.get("VIRTUAL_ENV") else "plain"
    print(f"\ndriver: {sys.executable} ({under_uv}); workers: {args.workers}")
    print(f"worker python: {facts[0]}")
    print(f"worker cwd:    {facts[1]}")
    shipped = "_ray_pkg_" in facts[1] or "runtime_resources" in facts[1]
    print(f"project shipped as a working_dir package: {'yes' if shipped else 'no'}")
    mi, mf = statistics.median(init_s), statistics.median(first_s)
    print(f"\n{'measure (median of ' + str(args.rounds) + ')':<40}{'seconds':>10}")
    print(f"{'ray.init alone':<40}{mi:>10.2f}")
    print(f"{'time to first rollout (init + actors)':<40}{mf:>10.2f}  (target <= 5 s)")
    print(f"{'of which actors + first rollout':<40}{mf - mi:>10.2f}")
    if hook_s:
        mh = statistics.median(hook_s)
        print(f"{'before: with the uv hook (shipped)':<40}{mh:>10.2f}  ({mh / mf:.1f}x)")
        print(f"  its workers' python: {hook_facts[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
