"""``maze-env demo``: the environment end to end on the fixed ``easy-64`` set, no RL stack.

Verifies the set's pinned hash, plays every maze through the Gymnasium API with the BFS oracle
and with a uniform random policy (both through text actions, as a model would answer), writes
images and SkyRL datasets, and prints what it measured.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import TextIO

from maze_env.env import MazeEnv
from maze_env.evalsets import verify_eval_set
from maze_env.export import export_datasets
from maze_env.maze import DEFAULT_SLACK
from maze_env.render import Renderer, token_aligned_style


def run_demo(
    out_dir: Path, out: TextIO, *, eval_set: str = "easy-64", seed: int = 0
) -> dict[str, float]:
    """Verify ``eval_set``, play it with the oracle and a random policy, write files to ``out_dir``.

    Args:
        out_dir: Where the example images and the SkyRL datasets go.
        out: Where the report lines are written.
        eval_set: The fixed set to play.
        seed: Seed of the random policy.

    Returns:
        The solve rate of each policy, ``{"oracle": ..., "random": ...}``.
    """
    es = verify_eval_set(eval_set)
    out.write(f"eval set {es.name}: {len(es.mazes)} mazes, sha256 {es.sha256[:16]}… verified\n")
    env = MazeEnv(es.spec)
    rng = random.Random(seed)
    words = [
        "<action>right</action>",
        "<action>up</action>",
        "<action>left</action>",
        "<action>down</action>",
    ]
    solved = {"oracle": 0, "random": 0}
    t0 = time.perf_counter()
    turns = 0
    for maze in es.mazes:
        for policy in solved:
            env.reset(options={"maze": maze})
            replies = (
                [f"<action>{d.word}</action>" for d in maze.optimal_actions]
                + ["<action>stop</action>"]
                if policy == "oracle"
                else None
            )
            done, i, reward = False, 0, 0.0
            while not done:
                if replies is not None:
                    reply = replies[i]
                else:
                    reply = "<action>stop</action>" if rng.random() < 0.05 else rng.choice(words)
                _, r, terminated, truncated, _ = env.step(reply)
                reward, done, i = float(r), terminated or truncated, i + 1
            turns += i
            solved[policy] += reward == 1.0
    elapsed = time.perf_counter() - t0
    n = len(es.mazes)
    out.write(f"budget per maze: optimal moves + stop + {DEFAULT_SLACK} slack\n")
    for policy, count in solved.items():
        out.write(f"{policy:>7} policy: solved {count}/{n} ({100 * count / n:.2f}%)\n")
    out.write(
        f"played {turns} turns in {elapsed:.2f} s ({turns / elapsed:,.0f} turns/s incl. rendering)\n"
    )

    out_dir.mkdir(parents=True, exist_ok=True)
    first = es.mazes[0]
    (out_dir / "maze_0.png").write_bytes(Renderer(first).png())
    (out_dir / "maze_0_token_aligned.png").write_bytes(Renderer(first, token_aligned_style()).png())
    paths = export_datasets(out_dir / "datasets", train_size=256, eval_set=eval_set)
    for split, path in paths.items():
        out.write(f"{split} dataset: {path}\n")
    out.write(f"images: {out_dir / 'maze_0.png'}, {out_dir / 'maze_0_token_aligned.png'}\n")
    return {k: v / n for k, v in solved.items()}
