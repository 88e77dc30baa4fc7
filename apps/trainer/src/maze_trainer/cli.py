"""``maze-train``: GRPO + LoRA for VLMs on visual mazes, on this CPU or a GPU Ray cluster.

With no arguments: the local engine on the shipped ``tiny_local`` config, i.e. a tiny Qwen3-VL
built from a config, warm-started on oracle demonstrations, then GRPO + LoRA on 5x5 mazes on
this machine's CPUs, reporting the eval set's solve rate at random init, after the warm start
and after GRPO.

``--engine skyrl`` runs SkyRL's own trainer with the shipped reference config (Qwen3-VL-8B,
LoRA r32, GRPO, easy-64); it needs the GPU container image. ``--submit ADDRESS`` submits the
run as a Ray job (e.g. ``sagemaker_ray://<raycluster>/<namespace>``).

``maze-train warm-start --out DIR`` runs the warm start alone (``local.warm_start``) and saves
the merged model.

Exit codes: 0 done, 2 config or usage error, 3 SkyRL training outside the GPU image.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from maze_engine.config import MazerlConfig

PROG = "maze-train"
EXIT_CONFIG_ERROR = 2
EXIT_NEEDS_GPU_IMAGE = 3
OVERRIDES_HELP = (
    "key=value overrides of any config key: SkyRL's (trainer.*, generator.*, ...), "
    "mazes.* (datasets) and local.* (local engine)"
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} [--engine {{local,skyrl}}] [--config CONFIG] [--submit ADDRESS] "
        "[--dry-run] [key=value ...]\n"
        f"       {PROG} warm-start --out DIR [--base DIR] [--config CONFIG] [key=value ...]",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--engine",
        choices=["local", "skyrl"],
        default="local",
        help="local: the CPU engine in this process; skyrl: SkyRL's trainer on a GPU Ray "
        "cluster (default %(default)s)",
    )
    p.add_argument(
        "--config",
        help="shipped config name or YAML path (default: tiny_local for the local engine, "
        "maze_grpo_qwen3vl8b for skyrl)",
    )
    p.add_argument(
        "--submit",
        metavar="ADDRESS",
        help="submit the run as a Ray job to this cluster address instead of running it here",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="validate and print the config; train nothing"
    )
    return p


def _warm_start_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{PROG} warm-start",
        usage=f"{PROG} warm-start --out DIR [--base DIR] [--config CONFIG] [key=value ...]",
        description="Warm-start a model on oracle episodes (the config's local.warm_start and "
        "mazes.* settings), evaluate it greedily and save it merged. " + OVERRIDES_HELP + ".",
    )
    p.add_argument("--out", required=True, type=Path, help="directory for the merged model")
    p.add_argument(
        "--base", type=Path, help="start from this model directory instead of a fresh tiny VLM"
    )
    p.add_argument(
        "--config", default="tiny_local", help="config name or YAML path (default %(default)s)"
    )
    return p


def _split_overrides(rest: Sequence[str]) -> list[str] | None:
    stray = [o for o in rest if o.startswith("-") or "=" not in o]
    if stray:
        print(f"{PROG}: expected key=value overrides, got {' '.join(stray)}", file=sys.stderr)
        return None
    return list(rest)


def _load(config: str, overrides: Sequence[str]) -> MazerlConfig | None:
    from maze_engine.config import load_config
    from maze_engine.errors import ConfigError

    try:
        return load_config(config, list(overrides))
    except ConfigError as exc:
        print(f"{PROG}: config error: {exc}", file=sys.stderr)
        return None


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2%}"


def _local(config_name: str, overrides: Sequence[str], dry_run: bool) -> int:
    from maze_engine.errors import ConfigError

    config = _load(config_name, overrides)
    if config is None:
        return EXIT_CONFIG_ERROR
    if dry_run:
        from skyrl.train.config import get_config_as_yaml_str

        print(get_config_as_yaml_str(config.skyrl))
        print(f"mazes: {config.mazes}")
        print(f"local: {config.local}")
        return 0
    from maze_engine.trainer import train

    try:
        result = train(config)
    except ConfigError as exc:  # found once the run directory is read
        print(f"{PROG}: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    stages = f"before GRPO {_pct(result.eval_before)} -> after {_pct(result.eval_after)}"
    if result.random_init is not None:
        stages = (
            f"random init {_pct(result.random_init)} -> warm start ({result.warm_start_steps} "
            f"oracle steps) {_pct(result.eval_before)} -> GRPO {_pct(result.eval_after)}"
        )
    print(f"{config.mazes.eval_set} solve rate: {stages} (global step {result.global_step})")
    print(f"final adapter: {result.final_adapter}")
    print(
        f"checkpoints: {config.skyrl.trainer.ckpt_path}  metrics: {result.run_dir / 'metrics.jsonl'}"
    )
    return 0


def _skyrl(config_name: str, overrides: Sequence[str], dry_run: bool) -> int:
    from maze_engine.cluster import require_gpu_stack, run_training
    from maze_engine.errors import ConfigError, GpuImageRequiredError

    try:
        if not dry_run:
            require_gpu_stack()  # before the slow SkyRL import: fail in a second, not in twenty
        config = _load(config_name, overrides)
        if config is None:
            return EXIT_CONFIG_ERROR
        if dry_run:
            from skyrl.train.config import get_config_as_yaml_str

            from maze_engine.data import eval_slack

            slack = eval_slack(config.max_turns, config.mazes.eval_set)
            print(get_config_as_yaml_str(config.skyrl))
            print(f"mazes: {config.mazes}")
            print(f"# datasets: {config.data_dir} (slack {slack})")
            return 0
        run_training(config)
    except ConfigError as exc:
        print(f"{PROG}: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except GpuImageRequiredError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_NEEDS_GPU_IMAGE
    return 0


def _submit(
    engine: str, config_name: str, overrides: Sequence[str], address: str, dry_run: bool
) -> int:
    from maze_engine.errors import ConfigError
    from maze_engine.submit import build_submit_command

    try:
        cmd = build_submit_command(config_name, overrides, address, engine=engine)
    except ConfigError as exc:
        print(f"{PROG}: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    print(shlex.join(cmd))
    return 0 if dry_run else subprocess.call(cmd)


def warm_start_main(argv: Sequence[str]) -> int:
    """``maze-train warm-start``: the warm start alone, evaluated before and after."""
    args, rest = _warm_start_parser().parse_known_args(argv)
    overrides = _split_overrides(rest)
    if overrides is None:
        return EXIT_CONFIG_ERROR
    config = _load(args.config, overrides)
    if config is None:
        return EXIT_CONFIG_ERROR
    import torch

    from maze_engine.sft import evaluate_policy, run_sft, save_merged
    from maze_policy.model import TinyVLMConfig, build_tiny_vlm, load_vlm
    from maze_policy.policy import Policy

    torch.set_num_threads(config.local.torch_threads)
    seed = int(config.skyrl.trainer.seed)
    ws, mazes = config.local.warm_start, config.mazes
    base = args.base or build_tiny_vlm(
        args.out / "_init", seed=seed, config=TinyVLMConfig(**config.local.tiny_model)
    )
    model, processor = load_vlm(base)
    policy = Policy(model, processor)
    seeds = tuple(range(ws.eval_mazes))

    def evaluate() -> str:
        res = evaluate_policy(
            policy,
            mazes.train_preset,
            seeds,
            cell_px=mazes.cell_px,
            max_new_tokens=ws.max_new_tokens,
        )
        return (
            f"solve {res.solve_rate:.2%} ({res.solved}/{res.episodes}), valid actions "
            f"{res.valid_action_rate:.2%}, mean turns {res.mean_turns:.1f}"
        )

    print(f"before: {evaluate()}", flush=True)
    report = run_sft(
        policy,
        ws,
        spec=mazes.train_preset,
        seed=seed,
        cell_px=mazes.cell_px,
        log=lambda row: print(row, flush=True),
    )
    print(f"after {report.steps_done} steps / {report.seconds:.0f} s: {evaluate()}", flush=True)
    save_merged(policy, args.out, report)
    print(f"saved {args.out}")
    return 0


def _quiet_skyrl_logs() -> None:
    # SkyRL logs through loguru at INFO on import (e.g. that vLLM is absent on a CPU box); keep
    # the terminal for the progress bars and warnings.
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``maze-train``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    _quiet_skyrl_logs()
    if argv[:1] == ["warm-start"]:
        return warm_start_main(argv[1:])
    args, rest = _parser().parse_known_args(argv)
    overrides = _split_overrides(rest)
    if overrides is None:
        return EXIT_CONFIG_ERROR
    from maze_engine.config import REFERENCE_CONFIG, TINY_LOCAL_CONFIG

    config = args.config or (REFERENCE_CONFIG if args.engine == "skyrl" else TINY_LOCAL_CONFIG)
    if args.submit:
        return _submit(args.engine, config, overrides, args.submit, args.dry_run)
    if args.engine == "skyrl":
        return _skyrl(config, overrides, args.dry_run)
    return _local(config, overrides, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
