"""Observation cost per rollout turn: the in-process path beside the OpenAI-message path.

    uv run python packages/maze-policy/benchmarks/bench_observation.py [--seconds 1] [--rounds 3]

One turn's observation is the env's feedback message (render the frame, wrap it) and the
encoder turning its image part back into a PIL image. The OpenAI-message path carries a PNG data
URI (render, PNG encode, base64; then base64 decode, PNG decode); the in-process path, which
``run_episodes`` uses, hands the rendered frame over as a PIL image. Both give the processor the
same pixels; its own preprocessing and tokenization (the same for both) is timed too, on the
tiny Qwen3-VL's processor.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from maze_env import MazeGame, generate
from maze_env.prompts import feedback_message
from maze_env.render import Renderer, Style
from maze_policy.chat import message_images


def _per_call_us(fn: Callable[[int], object], seconds: float) -> float:
    n, t0 = 0, time.perf_counter()
    while n < 50 or time.perf_counter() - t0 < seconds:
        fn(n)
        n += 1
    return (time.perf_counter() - t0) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    """Print the per-turn costs of both paths, medians over alternating rounds."""
    p = argparse.ArgumentParser(description="observation cost per rollout turn, both paths")
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--preset", default="easy")
    p.add_argument("--cell-px", type=int, default=25)
    args = p.parse_args(argv)

    maze = generate(args.preset, 7)
    renderer = Renderer(maze, Style(cell_px=args.cell_px))
    game = MazeGame.start(maze)
    result = game.step(maze.optimal_actions[0].word)
    agent, left = game.agent, game.steps_left

    def turn(inline: bool) -> Callable[[int], object]:
        def one(_: int) -> object:
            msg = feedback_message(result, agent, left, renderer, inline=inline)
            return message_images(msg)

        return one

    rows: dict[str, list[float]] = {"uri": [], "inline": []}
    for _ in range(args.rounds):
        rows["uri"].append(_per_call_us(turn(False), args.seconds))
        rows["inline"].append(_per_call_us(turn(True), args.seconds))
    uri, inline = statistics.median(rows["uri"]), statistics.median(rows["inline"])

    from maze_policy.model import build_tiny_vlm, load_processor

    with tempfile.TemporaryDirectory() as tmp:
        processor: Any = load_processor(build_tiny_vlm(Path(tmp), seed=0))
    (image,) = message_images(feedback_message(result, agent, left, renderer, inline=True))
    text = "<|vision_start|><|image_pad|><|vision_end|>Turns left: 9."
    proc = _per_call_us(
        lambda _: processor(text=[text], images=[image], return_tensors="pt"), args.seconds
    )

    h, w = maze.shape[0] * args.cell_px, maze.shape[1] * args.cell_px
    print(f"{args.preset} maze, {h}x{w} px frames; median of {args.rounds} alternating rounds")
    print(f"{'per turn (us)':<52}{'time':>10}")
    print(f"{'OpenAI-message path: render+PNG data URI+decode':<52}{uri:>10.1f}")
    print(f"{'in-process path: render+PIL frame (run_episodes)':<52}{inline:>10.1f}")
    print(f"{'ratio in-process / OpenAI-message path':<52}{inline / uri:>10.3f}")
    print(f"{'processor preprocess+tokenize (same in both paths)':<52}{proc:>10.1f}")
    print("target: in-process <= 500 us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
