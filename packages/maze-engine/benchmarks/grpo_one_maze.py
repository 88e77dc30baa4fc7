"""What GRPO can and cannot teach the warm-started tiny model: train on one maze layout.

    uv run python packages/maze-engine/benchmarks/grpo_one_maze.py runs/smoke-5x5 --steps 10

A 5x5 maze has four open cells, so its layout is one of 16: a start/goal corner pair times the
one walled passage of four; ``tiny-64`` draws 64 mazes from those 16. This script takes a 5x5
run's warm-started model (``RUN/base_model``, e.g. ``--config smoke_5x5``) and training rows, keeps only the rows of the layout
the warm start fails most often on ``tiny-64`` (or ``--layout``), and runs the engine's own GRPO
trainer (shipped config, in-process rollouts) on them. It prints the sampled solve rate per step,
the first move's distribution on every layout before and after, and ``tiny-64`` greedy before and
after: whether the update learns the trained layout, and whether it learned that layout or only a
prior that moves the other layouts sharing its start corner along with it.
"""

from __future__ import annotations

import argparse
import collections
import shutil
from pathlib import Path
from typing import Any

from maze_engine.config import load_config
from maze_engine.data import read_rows
from maze_engine.trainer import train
from maze_env import Maze, generate
from maze_env.actions import Action, parse_action
from maze_env.export import write_rows
from maze_policy.model import load_vlm
from maze_policy.policy import Policy
from maze_policy.rollout import run_episodes
from maze_policy.sampling import SamplingParams

PASSAGES = ((1, 2), (2, 1), (2, 3), (3, 2))


def layout(maze: Maze) -> str:
    """A 5x5 maze's layout: start, goal and which of the four passages is walled."""
    walled = next(p for p in PASSAGES if maze.walls[p])
    return f"start {maze.start} goal {maze.goal} wall {walled}"


def first_moves(
    policy: Policy, rows: list[dict[str, Any]], samples: int, tokens: int
) -> list[collections.Counter[str]]:
    """First-turn actions of ``samples`` sampled replies (T = 1) per row.

    A reply the env could not parse counts as ``invalid``.
    """
    reps = [r for r in rows for _ in range(samples)]
    eps = run_episodes(
        policy,
        reps,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=tokens),
        seed=7,
        max_turns=1,
    )
    out: list[collections.Counter[str]] = []
    for i in range(len(rows)):
        c: collections.Counter[str] = collections.Counter()
        for e in eps[i * samples : (i + 1) * samples]:
            parsed = parse_action(e.replies[0])  # as the env reads the reply
            c[parsed.word if isinstance(parsed, Action) else "invalid"] += 1
        out.append(c)
    return out


def greedy_solved(policy: Policy, rows: list[dict[str, Any]], tokens: int) -> list[bool]:
    """Whether each row's maze is solved by greedy decoding."""
    sampling = SamplingParams(greedy=True, max_new_tokens=tokens)
    eps = run_episodes(policy, rows, sampling=sampling, seed=0)
    return [e.solved for e in eps]


def load(base: Path, adapter: Path | None) -> Policy:
    """The base model, with ``adapter`` (a PEFT directory) on top when given."""
    model, processor = load_vlm(base)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))  # pyright: ignore[reportUnknownMemberType]
    model.eval()
    return Policy(model, processor)


def main() -> None:
    """Train on the chosen layout and print the before / after figures."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("run", type=Path, help="a main-job run directory (base_model/ and data/)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--samples", type=int, default=32, help="first-move samples per layout")
    p.add_argument("--layout", help="train on this layout (as printed) instead of the worst one")
    p.add_argument(
        "--out", type=Path, help="run directory for this experiment (default RUN-one-maze)"
    )
    args = p.parse_args()

    import torch

    torch.set_num_threads(1)
    base = args.run / "base_model"
    val = read_rows([args.run / "data" / "validation.parquet"])
    train_rows = read_rows([args.run / "data" / "train.parquet"])
    val_layouts = [layout(generate(r["preset"], int(r["seed"]))) for r in val]
    names = sorted(set(val_layouts))
    one_row = [val[val_layouts.index(n)] for n in names]  # one eval row per layout
    weight = collections.Counter(val_layouts)

    tokens = int(load_config("smoke_5x5", []).skyrl.generator.sampling_params.max_generate_length)
    before = load(base, None)
    solved_before = greedy_solved(before, val, tokens)
    moves_before = first_moves(before, one_row, args.samples, tokens)
    failed = collections.Counter(
        n for n, s in zip(val_layouts, solved_before, strict=True) if not s
    )
    target = args.layout or (failed.most_common(1)[0][0] if failed else names[0])
    if target not in names:
        raise SystemExit(f"unknown layout {target!r}; one of:\n  " + "\n  ".join(names))
    keep = [r for r in train_rows if layout(generate(r["preset"], int(r["seed"]))) == target]
    if not keep:
        raise SystemExit(f"no training row has layout {target!r}")

    out = args.out or args.run.with_name(args.run.name + "-one-maze")
    shutil.rmtree(out, ignore_errors=True)
    write_rows(keep, out / "data" / "train.parquet")
    shutil.copy(args.run / "data" / "validation.parquet", out / "data" / "validation.parquet")
    print(f"training on {len(keep)} rows of layout: {target}")
    config = load_config(
        "smoke_5x5",
        [
            f"trainer.export_path={out.resolve()}",
            f"trainer.policy.model.path={base.resolve()}",
            f"trainer.max_training_steps={args.steps}",
            f"trainer.eval_interval={args.steps}",
            f"trainer.ckpt_interval={args.steps}",
            f"trainer.hf_save_interval={args.steps}",
            "local.rollout_workers=0",
            "local.progress=false",
            "local.tensorboard=false",
        ],
    )
    result = train(config, say=lambda _m: None)
    steps = " ".join(f"{h['reward/avg_pass_at_1']:.2f}" for h in result.history)
    print(f"sampled solve rate on the trained layout, per step: {steps}")

    after = load(base, result.final_adapter)
    solved_after = greedy_solved(after, val, tokens)
    moves_after = first_moves(after, one_row, args.samples, tokens)
    print(f"\nfirst move, {args.samples} samples per layout (T = 1): before -> after GRPO")
    for n, row, mb, ma in zip(names, one_row, moves_before, moves_after, strict=True):
        best = generate(row["preset"], int(row["seed"])).optimal_actions[0].word
        mark = "*" if n == target else " "
        print(
            f"{mark} {n} (x{weight[n]} in tiny-64, shortest path starts {best}): {dict(mb)} -> {dict(ma)}"
        )
    print(
        f"\ntiny-64 greedy solve rate: {sum(solved_before) / len(val):.2%} -> "
        f"{sum(solved_after) / len(val):.2%}"
    )


if __name__ == "__main__":
    main()
