"""Verification throughput: vectorised replay vs per-episode MazeGame, and text parsing.

Run pinned to one core, as the README figures were:

    cd /work/main && taskset -c 0 uv run python packages/maze-verifier/benchmarks/bench_verify.py

Each episode is 20 moves then ``stop`` (21 turns, budget 21) on an ``easy`` maze; moves are
random, so episodes mix real moves and wall bumps. Mazes are shared by episode index modulo
``--mazes``, as GRPO groups share a prompt. Timings are the median of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from maze_env import Action, Direction, MazeGame, generate
from maze_verifier import MazeBatch, encode_turns, score_episode, verify_batch, verify_texts

REPLY = (
    "<observation>I am at row {r}, the goal is down and to the right.</observation>"
    "<justification>Moving {w} opens the corridor toward the goal.</justification>"
    "<action>{w}</action>"
)


def _median_time(fn: Callable[[], object], repeats: int) -> float:
    times: list[float] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Time each verification path, print the table (or JSON), and return the figures."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--episodes", type=int, default=100_000)
    ap.add_argument("--moves", type=int, default=20)
    ap.add_argument("--mazes", type=int, default=4096, help="distinct mazes the episodes share")
    ap.add_argument("--preset", default="easy")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline-episodes", type=int, default=5_000)
    ap.add_argument("--text-episodes", type=int, default=5_000)
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = ap.parse_args(argv)
    n_mazes: int = args.mazes
    preset: str = args.preset
    repeats: int = args.repeats

    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    mazes = [generate(preset, seed) for seed in range(n_mazes)]
    t_gen = time.perf_counter() - t0
    t0 = time.perf_counter()
    batch = MazeBatch.from_mazes(mazes)
    t_stack = time.perf_counter() - t0

    e: int = args.episodes
    t: int = args.moves + 1
    codes = rng.integers(0, 4, size=(e, t), dtype=np.int8)
    codes[:, -1] = 4
    idx: npt.NDArray[np.int64] = np.arange(e, dtype=np.int64) % n_mazes
    idx_list: list[int] = idx.tolist()
    budget = t

    def vectorised() -> object:
        return verify_batch(batch, codes, maze_index=idx, step_budget=budget, spec="efficiency")

    t_vec = _median_time(vectorised, repeats)
    res = verify_batch(batch, codes, maze_index=idx, step_budget=budget, spec="efficiency")

    # Baseline: the same episodes, one MazeGame each, actions already parsed.
    nb: int = min(args.baseline_episodes, e)
    table = [Action.move(d) for d in Direction] + [Action.stop()]
    code_rows: list[list[int]] = codes.tolist()
    parsed = [[table[c] for c in row] for row in code_rows[:nb]]

    def per_episode() -> None:
        for i in range(nb):
            game = MazeGame.start(mazes[idx_list[i]], step_budget=budget)
            for a in parsed[i]:
                game.step(a)

    t_base = _median_time(per_episode, max(1, repeats // 2))
    for i in range(min(nb, 500)):  # the two paths must agree on what they timed
        game = MazeGame.start(mazes[idx_list[i]], step_budget=budget)
        for a in parsed[i]:
            game.step(a)
        assert game.agent == tuple(res.final_pos[i]) and game.solved == bool(res.solved[i])

    # Text: realistic SFT-format replies through maze-env's parser, then the batch replay.
    nt: int = min(args.text_episodes, e)
    words = [d.word for d in Direction] + ["stop"]
    texts = [[REPLY.format(r=j, w=words[c]) for j, c in enumerate(row)] for row in code_rows[:nt]]
    n_replies = nt * t
    reply_chars = sum(len(x) for ep in texts for x in ep)
    t_parse = _median_time(lambda: encode_turns(texts, format_tags=None), max(1, repeats // 2))
    t_parse_tags = _median_time(
        lambda: encode_turns(texts, format_tags=("observation", "justification", "action")),
        max(1, repeats // 2),
    )
    t_text = _median_time(
        lambda: verify_texts(
            batch, texts, maze_index=idx[:nt], step_budget=budget, spec="visgym_sft"
        ),
        max(1, repeats // 2),
    )
    ns = min(nt, 1000)
    t_score = _median_time(
        lambda: [
            score_episode(mazes[idx_list[i]], texts[i], "visgym_sft", step_budget=budget)
            for i in range(ns)
        ],
        1,
    )

    figures = {
        "episodes": float(e),
        "turns_per_episode": float(t),
        "vectorised_episodes_per_s": e / t_vec,
        "vectorised_turns_per_s": e * t / t_vec,
        "mazegame_episodes_per_s": nb / t_base,
        "speedup": (e / t_vec) / (nb / t_base),
        "parse_replies_per_s": n_replies / t_parse,
        "parse_mb_per_s": reply_chars / t_parse / 1e6,
        "parse_and_tags_replies_per_s": n_replies / t_parse_tags,
        "text_path_episodes_per_s": nt / t_text,
        "score_episode_episodes_per_s": ns / t_score,
        "maze_generation_per_s": n_mazes / t_gen,
        "stack_mazes_s": t_stack,
        "solve_rate": float(res.solved.mean()),
    }
    if args.json:
        print(json.dumps(figures))
        return figures
    print(f"{e} episodes x {t} turns ({args.moves} moves + stop) on {n_mazes} {preset} mazes")
    print(f"{'path':<46}{'episodes/s':>14}{'turns/s':>14}")
    rows = [
        ("verify_batch (vectorised, int8 codes)", e / t_vec),
        ("MazeGame per episode (baseline, parsed)", nb / t_base),
        ("verify_texts (parse + tags + vectorised)", nt / t_text),
        ("score_episode per episode (parse + MazeGame)", ns / t_score),
    ]
    for name, eps in rows:
        print(f"{name:<46}{eps:>14,.0f}{eps * t:>14,.0f}")
    print(f"speedup vectorised / MazeGame: {figures['speedup']:.0f}x")
    print(
        f"text parsing: {figures['parse_replies_per_s']:,.0f} replies/s "
        f"({figures['parse_mb_per_s']:.1f} MB/s, {reply_chars / n_replies:.0f} chars/reply); "
        f"with tag checks {figures['parse_and_tags_replies_per_s']:,.0f} replies/s"
    )
    print(
        f"setup (not timed above): {figures['maze_generation_per_s']:,.0f} mazes/s generated, stacked in {t_stack:.3f} s"
    )
    return figures


if __name__ == "__main__":
    main()
