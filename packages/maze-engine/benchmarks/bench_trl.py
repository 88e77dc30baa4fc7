"""Rollout + update throughput of the local engine beside TRL's ``GRPOTrainer``, one turn each.

Sampled completion tokens per second over whole GRPO steps (rollout + update), on the same
tiny VLM, the same first-turn maze prompts and the same LoRA, group size, prompts per step,
max new tokens and temperature; CPU, fp32::

    uv run python packages/maze-engine/benchmarks/bench_trl.py --steps 4 --rounds 2

Each round trains ``--steps`` steps with ours (``smoke_5x5`` plus any key=value overrides,
episodes capped at one turn) and ``--steps`` steps with TRL once per ``--trl-threads`` value,
alternating which goes first, so machine load falls on both alike. TRL runs in its own
environment: a child process under ``uv run --isolated --no-project --with trl==VERSION``
(``_trl_child.py``), loading the model directory with plain transformers. The first step of
every run is warm-up and is not counted. The model is the random-init tiny Qwen3-VL
``smoke_5x5`` builds (``local.tiny_model``, ``trainer.seed``), or ``--base DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from maze_engine.config import MazerlConfig, load_config
from maze_engine.trainer import Datasets, Trainer, prepare_data

CHILD = Path(__file__).with_name("_trl_child.py")
RESULT_PREFIX = "TRL_RESULT "


@dataclass
class Run:
    """One side's steps in one round: wall seconds and sampled tokens, warm-up step dropped."""

    seconds: list[float] = field(default_factory=list[float])
    tokens: list[int] = field(default_factory=list[int])
    parts: dict[str, list[float]] = field(default_factory=dict[str, list[float]])


def base_model(config: MazerlConfig, run: Path, base: Path | None) -> Path:
    """``--base`` as is, or the random-init tiny model ``smoke_5x5`` builds, cached under ``run``."""
    if base is not None:
        return base
    out = run / "random_base"
    if not (out / "config.json").is_file():
        from maze_policy.model import TinyVLMConfig, build_tiny_vlm

        build_tiny_vlm(
            out,
            seed=int(config.skyrl.trainer.seed),
            config=TinyVLMConfig(**config.local.tiny_model),
        )
    return out


def first_turn_messages(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The opening messages our rollouts encode for ``row``: the env's own ``init`` prompt."""
    from maze_policy.rollout import drop_nulls, make_env

    env = make_env(row, {"inline_images": True})
    prompt, _ = env.init(drop_nulls(row["prompt"]))
    env.close()
    return [dict(m) for m in cast(Sequence[Mapping[str, Any]], prompt)]


def _text(content: object) -> str:
    # Message content is a string or a list of parts; the text parts, in order.
    if isinstance(content, str):
        return content
    parts = cast(list[dict[str, Any]], content)
    return "".join(str(p["text"]) for p in parts if "text" in p)


def write_trl_spec(
    config: MazerlConfig, data: Datasets, model_dir: Path, out: Path, threads: int
) -> Path:
    """The child's inputs: the training rows' first-turn prompts (PNG + text) and the settings."""
    from maze_env import MazeSpec
    from maze_env.maze import generate
    from maze_policy.chat import message_images
    from maze_policy.model import load_vlm
    from maze_policy.policy import suppressed_token_ids

    images = out / "images"
    images.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for i, row in enumerate(data.train):
        system, user = first_turn_messages(row)
        (image,) = message_images(user)
        path = images / f"{i}.png"  # PNG is lossless: the child sees the same pixels
        image.save(path)
        maze = generate(MazeSpec.parse(str(row["preset"])), int(row["seed"]))
        rows.append(
            {
                "system": _text(system["content"]),
                "task": _text(user["content"]),
                "image": str(path.resolve()),
                "first_move": maze.optimal_actions[0].word,
            }
        )
    model, processor = load_vlm(model_dir)
    t = config.skyrl.trainer
    lora = t.policy.model.lora
    spec = {
        "model_dir": str(model_dir.resolve()),
        "rows": rows,
        "threads": threads,
        "seed": int(t.seed),
        "n_samples": int(config.skyrl.generator.n_samples_per_prompt),
        "prompts": int(t.train_batch_size),
        "max_new_tokens": int(config.skyrl.generator.sampling_params.max_generate_length),
        "lr": float(t.policy.optimizer_config.lr),
        "max_grad_norm": float(t.policy.optimizer_config.max_grad_norm),
        "suppress_ids": suppressed_token_ids(model, cast(Any, processor).tokenizer),
        "lora": {
            "rank": int(lora.rank),
            "alpha": int(lora.alpha),
            "dropout": float(lora.dropout),
            "target_modules": lora.target_modules,
            "exclude_modules": lora.exclude_modules,
        },
    }
    path = out / f"spec_t{threads}.json"
    path.write_text(json.dumps(spec))
    return path


def our_prompt_ids(model_dir: Path, row: Mapping[str, Any]) -> list[int]:
    """Token ids of ``row``'s first prompt as our chat encoder writes them."""
    from maze_policy.chat import ChatEncoder
    from maze_policy.model import load_processor

    return ChatEncoder(load_processor(model_dir)).start(first_turn_messages(row)).input_ids


def run_ours(config: MazerlConfig, data: Datasets, model_dir: Path, steps: int) -> tuple[Run, int]:
    """``steps`` GRPO steps of the local engine, one turn per episode; returns the trainable count."""
    run_dir = Path(config.skyrl.trainer.export_path)
    shutil.rmtree(run_dir / "lora_sync", ignore_errors=True)
    trainer = Trainer(config, data, model_dir, say=lambda m: print(m, flush=True))
    # generator.max_turns must let every eval maze finish (a config check), so the cap on
    # turns goes on the trainer itself: train_step hands it to every rollout.
    trainer.max_turns = 1
    out = Run()
    try:
        trainer.rollouts.load_adapter(trainer.publish_adapter())
        for i in range(steps):
            t0 = time.perf_counter()
            m = trainer.train_step()
            wall = time.perf_counter() - t0
            if i == 0:
                continue  # warm-up
            out.seconds.append(wall)
            out.tokens.append(round(m["rollout/tokens_per_second"] * m["timing/generate"]))
            for k in ("timing/generate", "timing/policy_train", "timing/sync_weights"):
                out.parts.setdefault(k, []).append(m[k])
        trainable = sum(p.numel() for p in trainer.params)
    finally:
        trainer.close()
        import ray

        # TRL's turn should not share the machine with idle Ray daemons.
        ray.shutdown()
    return out, trainable


def run_trl(spec: Path, steps: int, out_dir: Path, trl_version: str) -> tuple[Run, dict[str, Any]]:
    """``steps`` steps of TRL's ``GRPOTrainer`` in its own environment (``_trl_child.py``)."""
    uv = os.environ.get("UV") or shutil.which("uv")
    if uv is None:
        raise SystemExit("uv not found: TRL runs in its own environment under `uv run --isolated`")
    threads = int(json.loads(spec.read_text())["threads"])
    cmd = [
        uv,
        "run",
        "--isolated",
        "--no-project",
        # This interpreter, so uv never downloads one.
        "--python",
        sys.executable,
        "--with",
        f"trl=={trl_version}",
        "--with",
        "peft",
        "--with",
        "pillow",
        # AutoProcessor builds Qwen3-VL's video processor, which needs torchvision.
        "--with",
        "torchvision",
        "python",
        str(CHILD),
        "--spec",
        str(spec),
        "--steps",
        str(steps),
        "--out-dir",
        str(out_dir),
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["OMP_NUM_THREADS"] = str(threads)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"TRL child failed (exit {proc.returncode}): {' '.join(cmd)}")
    res = cast(dict[str, Any], json.loads(lines[-1][len(RESULT_PREFIX) :]))
    seconds = [float(s) for s in res["step_seconds"]]
    tokens = [int(t) for t in res["step_tokens"]]
    if len(seconds) != steps or len(tokens) != steps:
        raise SystemExit(f"TRL child reported {len(seconds)} steps, {len(tokens)} token counts")
    rollout = [float(s) for s in res["rollout_seconds"]][1:]
    update = [s - g for s, g in zip(seconds[1:], rollout, strict=True)]
    return Run(seconds[1:], tokens[1:], {"rollout": rollout, "update": update}), res


def summary(runs: Sequence[Run]) -> tuple[float, float, int, float]:
    """Pooled tokens/s, steps/s, measured steps and mean tokens per step over ``runs``."""
    secs = sum(s for r in runs for s in r.seconds)
    toks = sum(t for r in runs for t in r.tokens)
    n = sum(len(r.seconds) for r in runs)
    return toks / secs, n / secs, n, toks / n


def main() -> None:
    """Alternate rounds of ours and TRL and print the side-by-side table."""
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4, help="steps per run, the first is warm-up")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--run", type=Path, default=Path("runs/bench-trl"))
    p.add_argument("--base", type=Path, default=None, help="model directory (default: random init)")
    p.add_argument("--trl-version", default="1.16.0")
    p.add_argument(
        "--trl-threads",
        type=int,
        nargs="+",
        default=None,
        help="torch threads of the TRL process, one run per value per round (default: "
        "local.torch_threads, and rollout_workers x torch_threads: the cores our rollouts use)",
    )
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    if args.steps < 2:
        raise SystemExit("--steps must be >= 2: the first step of each run is warm-up")
    overrides = [
        f"trainer.export_path={args.run}",
        "trainer.resume_mode=none",
        "trainer.eval_before_train=false",
        "trainer.eval_interval=0",
        "trainer.ckpt_interval=0",
        "local.progress=false",
        "local.tensorboard=false",
        *args.overrides,
    ]
    config = load_config("smoke_5x5", overrides)
    local = config.local
    torch.set_num_threads(local.torch_threads)
    args.run.mkdir(parents=True, exist_ok=True)
    data = prepare_data(config)
    model_dir = base_model(config, args.run, args.base)
    threads: list[int] = args.trl_threads or sorted(
        {local.torch_threads, max(1, local.rollout_workers) * local.torch_threads}
    )
    specs = {t: write_trl_spec(config, data, model_dir, args.run / "trl", t) for t in threads}
    ours: list[Run] = []
    trl: dict[int, list[Run]] = {t: [] for t in threads}
    info: dict[str, Any] = {}
    trainable = 0
    t_all = time.perf_counter()
    for r in range(args.rounds):
        # None is ours; an int is a TRL run with that many threads.
        order: list[int | None] = [None, *threads] if r % 2 == 0 else [*threads, None]
        for side in order:
            t0 = time.perf_counter()
            if side is None:
                run, trainable = run_ours(config, data, model_dir, args.steps)
                ours.append(run)
                label = "ours"
            else:
                run, info = run_trl(
                    specs[side], args.steps, args.run / "trl" / "out", args.trl_version
                )
                trl[side].append(run)
                label = f"TRL ({side} thread{'s' if side > 1 else ''})"
            tps = sum(run.tokens) / sum(run.seconds)
            print(
                f"round {r + 1} {label}: {tps:.0f} tokens/s, "
                f"{len(run.seconds) / sum(run.seconds):.3f} steps/s "
                f"({time.perf_counter() - t0:.0f} s with start-up)",
                flush=True,
            )
    wall = time.perf_counter() - t_all

    ours_ids = our_prompt_ids(model_dir, data.train[0])
    same_prompt = ours_ids == info["prompt_ids"]
    o_tps, o_sps, o_n, o_tok = summary(ours)
    print()
    print(
        f"config: smoke_5x5 {' '.join(args.overrides)}  rollout_workers={local.rollout_workers} "
        f"torch_threads={local.torch_threads}  1 turn per episode  "
        f"{config.skyrl.trainer.train_batch_size} prompts x "
        f"{config.skyrl.generator.n_samples_per_prompt} samples, "
        f"<= {config.skyrl.generator.sampling_params.max_generate_length} new tokens"
    )
    print(f"model: {model_dir}")
    print(
        f"first prompt: {len(ours_ids)} tokens ours, {len(info['prompt_ids'])} TRL, "
        f"identical ids: {'yes' if same_prompt else 'NO'}"
    )
    print(f"LoRA trainable parameters: ours {trainable}, TRL {info['trainable_params']}")
    vers = info["versions"]
    import peft
    import transformers

    print(
        f"versions: ours torch {torch.__version__}, transformers {transformers.__version__}, "
        f"peft {peft.__version__}; TRL side trl {vers['trl']}, transformers "
        f"{vers['transformers']}, torch {vers['torch']}, peft {vers['peft']}"
    )
    print(f"rounds: {args.rounds} x {args.steps} steps per run (first excluded), {wall:.0f} s")
    print()
    print(f"{'':<22}{'tokens/s':>10}{'steps/s':>10}{'steps':>7}{'tok/step':>10}{'ours/x':>8}")
    print(f"{'ours':<22}{o_tps:>10.1f}{o_sps:>10.3f}{o_n:>7}{o_tok:>10.1f}{'':>8}")
    for t in threads:
        tps, sps, n, tok = summary(trl[t])
        name = f"TRL GRPOTrainer, {t} thr"
        print(f"{name:<22}{tps:>10.1f}{sps:>10.3f}{n:>7}{tok:>10.1f}{o_tps / tps:>8.2f}")
    print()
    print("per step (median), s:")
    for k in ours[0].parts:
        print(f"  ours {k:<31}{statistics.median(v for r in ours for v in r.parts[k]):>7.3f}")
    for t in threads:
        for k in ("rollout", "update"):
            med = statistics.median(v for r in trl[t] for v in r.parts[k])
            print(f"  TRL {t} thr {k:<26}{med:>7.3f}")
    if not same_prompt:
        raise SystemExit("the two sides did not encode the same first prompt")


if __name__ == "__main__":
    main()
