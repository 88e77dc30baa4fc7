"""Rollout time with the key/value cache kept from turn to turn, beside re-reading every turn.

    uv run python packages/maze-policy/benchmarks/bench_rollout.py --mazes 16 --rounds 3

``run_episodes`` on the first ``--mazes`` mazes of an eval set (small-64: 7x7, slack 2, so up to
19 turns), with a tiny Qwen3-VL built from a config (random weights: its replies never stop, so
every episode runs its whole budget, the longest conversations a run sees), greedy and sampled.
``keep_cache`` (the default) reads only each turn's new tokens; ``keep_cache=False`` re-reads
the whole conversation every turn (``Policy.generate``). The two alternate within each round,
in one process with one torch thread; the script checks that greedy replies are the same.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from maze_env import get_eval_set
from maze_env.export import build_rows
from maze_env.render import Style
from maze_policy.model import build_tiny_vlm, load_vlm
from maze_policy.policy import Policy
from maze_policy.rollout import run_episodes
from maze_policy.sampling import SamplingParams


def main() -> None:
    """Print the median seconds per rollout of each path and their ratio."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("--eval-set", default="small-64")
    ap.add_argument("--mazes", type=int, default=16)
    ap.add_argument("--slack", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(1)
    es = get_eval_set(args.eval_set)
    rows = build_rows(
        es.spec,
        es.seeds[: args.mazes],
        split="validation",
        slack=args.slack,
        style=Style(cell_px=32),
    )
    with tempfile.TemporaryDirectory() as tmp:
        model, processor = load_vlm(build_tiny_vlm(tmp, seed=0))
    policy = Policy(model, processor)
    modes = {
        "greedy": SamplingParams(greedy=True, max_new_tokens=args.max_new_tokens),
        "sampled T=1": SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens),
    }
    times: dict[tuple[str, bool], list[float]] = {}
    turns = 0
    for r in range(args.rounds):
        for name, params in modes.items():
            replies: dict[bool, list[list[str]]] = {}
            for keep in (True, False):
                t0 = time.perf_counter()
                eps = run_episodes(policy, rows, sampling=params, seed=r, keep_cache=keep)
                times.setdefault((name, keep), []).append(time.perf_counter() - t0)
                replies[keep] = [e.replies for e in eps]
                turns = sum(e.turns for e in eps)
            if params.greedy and replies[True] != replies[False]:
                raise SystemExit("greedy replies differ between the two paths")
    print(
        f"{args.eval_set}: {len(rows)} episodes, {turns} turns per rollout, "
        f"{args.rounds} rounds, 1 torch thread"
    )
    print("| rollout | re-read every turn (s) | keep the cache (s) | ratio |")
    print("|---|---:|---:|---:|")
    for name in modes:
        plain = statistics.median(times[(name, False)])
        kept = statistics.median(times[(name, True)])
        print(f"| {name} | {plain:.2f} | {kept:.2f} | {kept / plain:.2f}x |")


if __name__ == "__main__":
    main()
