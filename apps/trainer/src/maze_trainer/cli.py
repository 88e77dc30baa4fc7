"""``maze-train [--engine local|skyrl] [--config NAME|PATH] [key=value ...]``.

With no arguments: the local engine on the shipped ``tiny_local`` config, i.e. a tiny Qwen3-VL
built from a config, warm-started on oracle demonstrations, then GRPO + LoRA on 5x5 mazes on
this machine's CPUs, reporting the ``tiny-64`` solve rate at random init, after the warm start and
after GRPO.

``--engine skyrl`` runs SkyRL's own trainer on a GPU Ray cluster with the shipped reference
config (Qwen3-VL-8B, LoRA r32, GRPO, easy-64); it needs the GPU container image. ``--submit
ADDRESS`` submits that run as a Ray job (e.g. ``sagemaker_ray://<raycluster>/<namespace>``).
"""

from __future__ import annotations

import argparse
import logging
import shlex
import subprocess
import sys
from collections.abc import Sequence

EXIT_CONFIG_ERROR = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="maze-train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--engine", choices=["local", "skyrl"], default="local")
    p.add_argument(
        "--config",
        help="shipped config name or YAML path (local: tiny_local; skyrl: maze_grpo_qwen3vl8b)",
    )
    p.add_argument(
        "--submit",
        metavar="ADDRESS",
        help="skyrl engine: submit as a Ray job to this cluster address",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="validate and print the config; train nothing"
    )
    return p


def _local(config: str, overrides: Sequence[str], dry_run: bool) -> int:
    from maze_engine.config import LocalConfig, LocalConfigError
    from maze_engine.skyrl_cluster import SkyRLConfigError, eval_slack, load_config

    try:
        cfg, local_dict = load_config(config, overrides)
        local = LocalConfig.from_dict(local_dict)
        eval_slack(int(cfg.generator.max_turns), local.eval_set)  # every eval maze finishable
    except (SkyRLConfigError, LocalConfigError) as exc:
        print(f"maze-train: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    if dry_run:
        from skyrl.train.config import get_config_as_yaml_str

        print(get_config_as_yaml_str(cfg))
        print(f"local: {local}")
        return 0
    from maze_engine.trainer import train

    try:
        result = train(cfg, local)
    except (SkyRLConfigError, LocalConfigError) as exc:  # found once the run directory is read
        print(f"maze-train: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2%}"

    stages = f"before GRPO {pct(result.eval_before)} -> after {pct(result.eval_after)}"
    if result.random_init is not None:
        stages = (
            f"random init {pct(result.random_init)} -> warm start ({result.warm_start_steps} "
            f"oracle steps) {pct(result.eval_before)} -> GRPO {pct(result.eval_after)}"
        )
    print(f"{local.eval_set} solve rate: {stages} (global step {result.global_step})")
    print(f"final adapter: {result.final_adapter}")
    print(f"checkpoints: {cfg.trainer.ckpt_path}  metrics: {result.run_dir / 'metrics.jsonl'}")
    return 0


def _skyrl(args: argparse.Namespace, overrides: Sequence[str]) -> int:
    from maze_engine import skyrl_cluster

    config = args.config or skyrl_cluster.REFERENCE_CONFIG
    if args.submit:
        try:
            cmd = skyrl_cluster.build_submit_command(config, overrides, args.submit)
        except skyrl_cluster.SkyRLConfigError as exc:
            print(f"maze-train: config error: {exc}", file=sys.stderr)
            return EXIT_CONFIG_ERROR
        print(shlex.join(cmd))
        return 0 if args.dry_run else subprocess.call(cmd)
    return skyrl_cluster.main(
        ["--config", config, *(["--dry-run"] if args.dry_run else []), *overrides]
    )


def _quiet_skyrl_logs() -> None:
    # SkyRL logs through loguru at INFO on import (e.g. that vLLM is absent on a CPU box); keep
    # the terminal for our progress bar and warnings.
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING")


def main(argv: Sequence[str] | None = None) -> int:
    args, overrides = _parser().parse_known_args(argv)
    stray = [o for o in overrides if o.startswith("-") or "=" not in o]
    if stray:
        print(f"maze-train: expected key=value overrides, got {' '.join(stray)}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    _quiet_skyrl_logs()
    if args.engine == "skyrl":
        return _skyrl(args, overrides)
    if args.submit:
        print("maze-train: --submit needs --engine skyrl", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    return _local(args.config or "tiny_local", overrides, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
