"""maze-train: GRPO + LoRA for VLMs on visual mazes, on this CPU or a GPU Ray cluster.

With no arguments: the local engine on the shipped tiny_local config (the main job), i.e. the
shipped tiny Qwen3-VL route base warm-started on oracle demonstrations, then GRPO + LoRA on 7x7
mazes on this machine's CPUs, reporting the held-out eval set's solve rate (small-64, no layout
shared with training) before the warm start, after it and after GRPO. The run directory gets
metrics.jsonl and curves.png (redrawn at each eval and at the end).

--engine skyrl runs SkyRL's own trainer with the shipped reference config (Qwen3-VL-8B, LoRA
r32, GRPO, easy-64); it needs the GPU container image. --submit ADDRESS submits the run as a
Ray job (sagemaker_ray://<raycluster>/<namespace>, http://<head>:8265 or <head>:8265) and
streams its logs until it ends.

maze-train warm-start --out DIR runs the warm start alone (local.warm_start) and saves the
merged model. maze-train plot RUN_DIR redraws RUN_DIR/curves.png from RUN_DIR/metrics.jsonl.

Exit codes: 0 done (a submitted job: it succeeded); 1 the submitted Ray job failed or was
stopped; 2 config or usage error; 3 SkyRL training outside the GPU image; 4 the Ray job server
cannot be reached; 5 the address needs a package that is not installed here; 6 the local
engine's Ray rollout workers did not start or were lost with their node (rerun to resume from the
latest checkpoint).
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from maze_engine.config import MazerlConfig

PROG = "maze-train"
EXIT_JOB_FAILED = 1
EXIT_CONFIG_ERROR = 2
EXIT_NEEDS_GPU_IMAGE = 3
EXIT_JOB_SERVER_UNREACHABLE = 4
EXIT_MISSING_PACKAGE = 5
EXIT_WORKERS_LOST = 6
EXIT_INTERRUPTED = 130
OVERRIDES_HELP = (
    "key=value overrides of any config key: SkyRL's (trainer.*, generator.*, ...), "
    "mazes.* (datasets) and local.* (local engine)"
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} [--engine {{local,skyrl}}] [--config CONFIG] [--submit ADDRESS] "
        "[--dry-run] [key=value ...]\n"
        f"       {PROG} warm-start --out DIR [--base DIR] [--config CONFIG] [key=value ...]\n"
        f"       {PROG} plot RUN_DIR [--out PNG]",
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
        help="submit the run as a Ray job to this cluster address instead of running it here, "
        "and stream its logs until it ends",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate and print the config (with --submit: the equivalent 'ray job submit' "
        "command); train nothing",
    )
    _overrides_arg(p)
    return p


def _overrides_arg(p: argparse.ArgumentParser) -> None:
    # Listed so that --help explains them; main() reads them with parse_known_args.
    p.add_argument("overrides", nargs="*", metavar="key=value", help=OVERRIDES_HELP)


def _plot_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{PROG} plot",
        usage=f"{PROG} plot RUN_DIR [--out PNG]",
        description="Redraw a run's training curves (eval solve rate, sampled reward and "
        "pass@k, policy entropy and KL, step time by phase) from RUN_DIR/metrics.jsonl.",
    )
    p.add_argument(
        "run_dir", metavar="RUN_DIR", type=Path, help="a run directory (trainer.export_path)"
    )
    p.add_argument(
        "--out", type=Path, metavar="PNG", help="where the PNG goes (default RUN_DIR/curves.png)"
    )
    return p


def _warm_start_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{PROG} warm-start",
        usage=f"{PROG} warm-start --out DIR [--base DIR] [--config CONFIG] [key=value ...]",
        description="Warm-start a model on oracle episodes (the config's local.warm_start and "
        "mazes.* settings), evaluate it greedily and save it merged.",
    )
    p.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="directory for the merged model"
    )
    p.add_argument(
        "--base",
        type=Path,
        metavar="DIR",
        help="start from this model directory instead of the config's local.tiny_base",
    )
    p.add_argument(
        "--config", default="tiny_local", help="config name or YAML path (default %(default)s)"
    )
    _overrides_arg(p)
    return p


def _pretrain_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{PROG} pretrain",
        usage=f"{PROG} pretrain --out DIR [--config CONFIG] [key=value ...]",
        description="Pretrain a tiny VLM on dense descriptions of rendered mazes: transcribe them "
        "square by square and, for local.perception.route_share of the examples, name the way "
        "from the agent to the goal (local.perception; local.perception.init is where the model "
        "starts, local.tiny_model sizes a model built here). Writes the model, recipe.json and a "
        "manifest to DIR, ready to ship under maze_engine/artifacts/. " + OVERRIDES_HELP + ".",
    )
    p.add_argument("--out", required=True, type=Path, help="directory for the artifact")
    p.add_argument(
        "--config", default="tiny_local", help="config name or YAML path (default %(default)s)"
    )
    return p


def _probe_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{PROG} probe",
        description="Measure a model's perception on an eval set, per layout class: how often "
        "its greedy first move follows the walls, and how often it reads the squares next to "
        "the agent right (transcription, teacher-forced).",
    )
    p.add_argument(
        "model", help="model directory, or a shipped artifact name (tiny-qwen3vl-perception)"
    )
    p.add_argument("--eval-set", default="small-64", help="fixed eval set (default %(default)s)")
    p.add_argument(
        "--cell-px", type=int, default=32, help="pixels per grid square (default %(default)s)"
    )
    return p


def pretrain_main(argv: Sequence[str]) -> int:
    """``maze-train pretrain``: the perception stage, saved as an artifact."""
    args, rest = _pretrain_parser().parse_known_args(argv)
    overrides = _split_overrides(rest)
    if overrides is None:
        return EXIT_CONFIG_ERROR
    config = _load(args.config, overrides)
    if config is None:
        return EXIT_CONFIG_ERROR
    import json

    from maze_engine.perception import pretrain

    command = shlex.join([PROG, "pretrain", *argv])
    out = pretrain(
        config, args.out, command=command, log=lambda r: print(json.dumps(r), flush=True)
    )
    print(f"saved {out}")
    return 0


def probe_main(argv: Sequence[str]) -> int:
    """``maze-train probe``: perception per layout class, as a table."""
    args = _probe_parser().parse_args(argv)
    from maze_engine.artifacts import ArtifactError, artifact_path
    from maze_engine.perception import probe
    from maze_policy.errors import ModelLoadError
    from maze_policy.model import load_vlm
    from maze_policy.policy import Policy

    try:
        path = Path(args.model) if Path(args.model).is_dir() else artifact_path(args.model)
        model, processor = load_vlm(path)
    except (ArtifactError, ModelLoadError) as exc:
        print(f"{PROG} probe: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    table = probe(Policy(model, processor), args.eval_set, cell_px=args.cell_px)
    print("| layout class | mazes | first move follows the walls | neighbours read right |")
    print("|---|---|---|---|")
    for key, row in table.items():
        first = "-" if row["first_move_good"] is None else f"{row['first_move_good']:.0%}"
        print(f"| {key} | {row['mazes']} | {first} | {row['neighbour_accuracy']:.0%} |")
    return 0


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


def _latest_checkpoint(config: MazerlConfig) -> str:
    from maze_engine.checkpoint import CheckpointManager

    ckpt = CheckpointManager(Path(config.skyrl.trainer.ckpt_path)).latest_valid()
    return f"global step {ckpt.step}" if ckpt else "none yet: it starts over"


def _local(config_name: str, overrides: Sequence[str], dry_run: bool) -> int:
    from maze_engine.errors import ConfigError, RolloutWorkerError

    config = _load(config_name, overrides)
    if config is None:
        return EXIT_CONFIG_ERROR
    if dry_run:
        from skyrl.train.config import get_config_as_yaml_str

        print(get_config_as_yaml_str(config.skyrl))
        print(f"mazes: {config.mazes}")
        print(f"local: {config.local}")
        return 0
    from maze_engine.decisions import DECISIONS_FILE
    from maze_engine.trainer import train
    from maze_policy.contexts import CONTEXT_FILE

    try:
        result = train(config)
    except ConfigError as exc:  # found once the run directory is read
        print(f"{PROG}: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except RolloutWorkerError as exc:
        print(
            f"{PROG}: {exc}; rerun with the same run directory to resume from the latest "
            f"checkpoint ({_latest_checkpoint(config)})",
            file=sys.stderr,
        )
        return EXIT_WORKERS_LOST
    stages = f"before GRPO {_pct(result.eval_before)} -> after {_pct(result.eval_after)}"
    if result.base_solve_rate is not None:
        demos = result.warm_start_demonstrator or "oracle"
        rehearsal = result.warm_start_route_rehearsal
        recipe = f"{result.warm_start_steps} {demos} steps" + (
            f" + {rehearsal} route questions each" if rehearsal else ""
        )
        stages = (
            f"{result.base_label} {_pct(result.base_solve_rate)} -> warm start ({recipe}) "
            f"{_pct(result.eval_before)} -> GRPO {_pct(result.eval_after)}"
        )
    steps = f"global step {result.global_step}"
    if config.local.route_rehearsal:  # a supervised term beside GRPO's: say so with its result
        steps += f"; {config.local.route_rehearsal} route questions rehearsed after each update"
    print(f"{config.mazes.eval_set} solve rate: {stages} ({steps})")
    for name, (before, after) in result.reports.items():
        print(f"{name} solve rate: before GRPO {_pct(before)} -> after {_pct(after)}")
    print(f"final adapter: {result.final_adapter}")
    context = config.local.context
    if context != "full":  # in the whole conversation it is not the policy that was trained
        print(
            f"it answers each turn in context {context!r}, recorded beside the adapter "
            f"({CONTEXT_FILE}), where maze-eval and maze-serve read it"
        )
    decisions = result.run_dir / DECISIONS_FILE
    if decisions.is_file():
        print(f"what GRPO changed, per layout class: {decisions}")
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
    from maze_engine.errors import ConfigError, JobClientMissingError, JobServerError
    from maze_engine.submit import build_job, connect, follow, require_job_client, start

    try:
        if not dry_run:
            require_job_client(address)  # before the slow config check
        job = build_job(config_name, overrides, address, engine=engine)
    except ConfigError as exc:
        print(f"{PROG}: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except JobClientMissingError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_MISSING_PACKAGE
    if dry_run:
        print(shlex.join(job.command()))
        return 0
    job_id = None
    try:
        client = connect(job.address)
        job_id = start(client, job)
        print(
            f"{PROG}: submitted Ray job {job_id} to {job.address}; following its logs "
            "(Ctrl-C stops following, not the job)",
            flush=True,
        )
        outcome = follow(client, job_id, job.address, lambda s: print(s, end="", flush=True))
    except JobClientMissingError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_MISSING_PACKAGE
    except JobServerError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_JOB_SERVER_UNREACHABLE
    except KeyboardInterrupt:
        if job_id is None:
            return EXIT_INTERRUPTED
        print(
            f"{PROG}: stopped following Ray job {job_id}; it keeps running "
            f"(ray job stop {job_id} --address {job.address})",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    if outcome.succeeded:
        print(f"{PROG}: Ray job {job_id} succeeded")
        return 0
    detail = f" (exit code {outcome.driver_exit_code})" if outcome.driver_exit_code else ""
    why = f": {outcome.reason}" if outcome.reason else ""
    print(f"{PROG}: Ray job {job_id} {outcome.status.lower()}{detail}{why}", file=sys.stderr)
    return EXIT_JOB_FAILED


def plot_main(argv: Sequence[str]) -> int:
    """maze-train plot: redraw a run's curves.png from its metrics.jsonl."""
    args = _plot_parser().parse_args(argv)
    from maze_engine.errors import MetricsFileError
    from maze_engine.plots import write_curves

    try:
        print(write_curves(args.run_dir, args.out))
    except MetricsFileError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except OSError as exc:
        print(f"{PROG}: cannot write the curves: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    return 0


def warm_start_main(argv: Sequence[str]) -> int:
    """``maze-train warm-start``: the warm start alone, evaluated before and after."""
    args, rest = _warm_start_parser().parse_known_args(argv)
    overrides = _split_overrides([*args.overrides, *rest])
    if overrides is None:
        return EXIT_CONFIG_ERROR
    config = _load(args.config, overrides)
    if config is None:
        return EXIT_CONFIG_ERROR
    import torch

    from maze_engine.trainer import warm_start_alone

    torch.set_num_threads(config.local.torch_threads)
    warm_start_alone(config, args.out, base=args.base, say=lambda line: print(line, flush=True))
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
    subcommands = {"warm-start": warm_start_main, "pretrain": pretrain_main, "probe": probe_main}
    if argv[:1] and argv[0] in subcommands:
        return subcommands[argv[0]](argv[1:])
    if argv[:1] == ["plot"]:
        return plot_main(argv[1:])
    args, rest = _parser().parse_known_args(argv)
    overrides = _split_overrides([*args.overrides, *rest])
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
