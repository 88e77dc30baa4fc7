"""Our env's reset+render and step, beside VisGym's pygame env.

    cd /work/main && uv run python packages/maze-env/benchmarks/bench_env.py --seconds 1

VisGym's figures were measured on this project's 2-core machines (see shared reference):
its env needs pygame and its gymnasium fork, so it is not run here; its numbers are quoted.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from maze_env.actions import parse_action
from maze_env.env import MazeEnv
from maze_env.render import Renderer

# (reset+render ms, step ms) of VisGym's maze_2d on these machines.
VISGYM_MS = {"easy": (1.1, 0.25), "hard": (1.6, 0.25)}


def _per_call_us(fn: Callable[[int], object], seconds: float) -> float:
    """Mean microseconds per call, over as many calls as fit in ``seconds`` (at least 200)."""
    n, t0 = 0, time.perf_counter()
    while n < 200 or time.perf_counter() - t0 < seconds:
        fn(n)
        n += 1
    return (time.perf_counter() - t0) / n * 1e6


def _step_us(env: MazeEnv, seconds: float) -> float:
    # Time steps only: resets between episodes are excluded from the clock.
    total, n, i = 0.0, 0, 0
    env.reset(seed=0)
    deadline = time.perf_counter() + seconds
    while n < 1000 or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        env.step(i % 4)
        total += time.perf_counter() - t0
        n, i = n + 1, i + 1
        if env.game.done:
            env.reset(seed=i)
    return total / n * 1e6


def run_bench(seconds: float, out: TextIO) -> None:
    """Write the timing table to ``out``; each measurement runs for about ``seconds``."""
    out.write(f"{'measure':<28}{'mazerl':>12}{'VisGym':>12}{'ratio':>9}\n")
    for preset, (vg_reset, vg_step) in VISGYM_MS.items():
        env = MazeEnv(preset)
        reset = _per_call_us(lambda i, env=env: env.reset(seed=i), seconds)
        step = _step_us(env, seconds)
        out.write(
            f"{preset + ' reset+render (us)':<28}{reset:>12.1f}{vg_reset * 1000:>12.0f}{reset / (vg_reset * 1000):>9.3f}\n"
        )
        out.write(
            f"{preset + ' step+render (us)':<28}{step:>12.1f}{vg_step * 1000:>12.0f}{step / (vg_step * 1000):>9.3f}\n"
        )
    env = MazeEnv("easy")
    env.reset(seed=0)
    renderer = Renderer(env.maze)
    png = _per_call_us(lambda i: renderer.data_uri(), seconds)
    out.write(f"{'easy PNG data URI (us)':<28}{png:>12.1f}{'-':>12}{'-':>9}\n")
    reply = "<observation>wall above</observation><justification>goal is right</justification><action>right</action>"
    parse = _per_call_us(lambda i: parse_action(reply), seconds)
    out.write(f"{'parse tagged reply (us)':<28}{parse:>12.2f}{'-':>12}{'-':>9}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Print the timing table to stdout."""
    parser = argparse.ArgumentParser(
        description="time reset+render and step against VisGym's figures"
    )
    parser.add_argument("--seconds", type=float, default=1.0, help="time budget per measurement")
    args = parser.parse_args(argv)
    run_bench(args.seconds, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
