"""Our env's reset+render and step beside VisGym's ``maze_2d``, run side by side in one run.

    cd /work/main && uv run python packages/maze-env/benchmarks/bench_env.py --seconds 1
        --visgym /path/to/VisGym [--visgym-python /path/to/python-with-pygame]

VisGym installs as a fork named ``gymnasium`` (it would shadow the real one), so it runs in a
child process with ``PATH`` (a checkout of VisGym, the folder holding its ``gymnasium/``) first
on ``sys.path``, under ``--visgym-python`` (default: this interpreter; it needs numpy and
pygame). The child and this process take turns, measurement by measurement, so drift in the
machine's load hits both alike. Without ``--visgym`` only our figures are printed, beside the
fixed VisGym figures once measured on these machines, clearly labelled as not run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO, cast

from maze_env.actions import parse_action
from maze_env.env import MazeEnv
from maze_env.render import Renderer

# (reset+render ms, step ms) of VisGym's maze_2d on these machines, for runs without a checkout.
VISGYM_FIXED_MS = {"easy": (1.1, 0.25), "hard": (1.6, 0.25)}
PRESETS = ("easy", "hard")

# The child: VisGym's own env through its own ``gymnasium.make``, timed like ours. Each line
# on stdin names a measurement; the answer is one JSON number (microseconds per call).
_VISGYM_CHILD = r"""
import json, sys, time
import gymnasium as gym
assert hasattr(gym, "VLMEnvMixin"), "not VisGym's gymnasium fork: " + gym.__file__
envs = {p: gym.make(f"maze_2d/{p}") for p in ("easy", "hard")}
MOVES = ["('move', %d)" % d for d in range(4)]
def reset_us(env, seconds):
    n, t0 = 0, time.perf_counter()
    while n < 200 or time.perf_counter() - t0 < seconds:
        env.reset(seed=n)  # VisGym's reset renders the frame it returns
        n += 1
    return (time.perf_counter() - t0) / n * 1e6
def step_us(env, seconds):
    total, n, i = 0.0, 0, 0
    env.reset(seed=0)
    deadline = time.perf_counter() + seconds
    while n < 1000 or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        _, _, term, trunc, _ = env.step(MOVES[i % 4])
        total += time.perf_counter() - t0
        n, i = n + 1, i + 1
        if term or trunc:
            env.reset(seed=i)
    return total / n * 1e6
print(json.dumps({"ready": gym.__file__}), flush=True)
for line in sys.stdin:
    preset, what, seconds = line.split()
    fn = reset_us if what == "reset" else step_us
    print(json.dumps(fn(envs[preset], float(seconds))), flush=True)
"""


class VisGym:
    """A child process running VisGym's ``maze_2d`` from a checkout."""

    def __init__(self, checkout: Path, python: str) -> None:
        if not (checkout / "gymnasium" / "envs" / "maze_2d" / "maze_2d.py").is_file():
            raise SystemExit(f"{checkout}: no gymnasium/envs/maze_2d/maze_2d.py (not VisGym?)")
        env = {**os.environ, "PYTHONPATH": str(checkout.resolve()), "SDL_VIDEODRIVER": "dummy"}
        self._proc = subprocess.Popen(
            [python, "-c", _VISGYM_CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=checkout,
        )
        ready = self._read()
        if not isinstance(ready, dict):
            raise SystemExit(f"VisGym child did not start: {ready!r}")
        self.where = str(cast(dict[str, object], ready).get("ready"))

    def _read(self) -> object:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise SystemExit("VisGym child exited (see its error above)")
        return json.loads(line)

    def measure(self, preset: str, what: str, seconds: float) -> float:
        assert self._proc.stdin is not None
        self._proc.stdin.write(f"{preset} {what} {seconds}\n")
        self._proc.stdin.flush()
        return float(self._read())  # pyright: ignore[reportArgumentType]

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(timeout=30)


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


def _ours(preset: str, what: str, seconds: float) -> float:
    env = MazeEnv(preset)
    if what == "reset":
        return _per_call_us(lambda i: env.reset(seed=i), seconds)
    return _step_us(env, seconds)


def run_bench(seconds: float, rounds: int, visgym: VisGym | None, out: TextIO) -> None:
    """Write the timing table to ``out``; each measurement runs for about ``seconds``."""
    peer = "VisGym" if visgym is not None else "VisGym*"
    out.write(
        f"{'measure (median of ' + str(rounds) + ')':<30}{'mazerl':>10}{peer:>10}{'ratio':>8}\n"
    )
    for preset in PRESETS:
        for what, label in (("reset", "reset+render"), ("step", "step+render")):
            ours: list[float] = []
            theirs: list[float] = []
            for _ in range(rounds):
                ours.append(_ours(preset, what, seconds))
                if visgym is not None:
                    theirs.append(visgym.measure(preset, what, seconds))
            o = statistics.median(ours)
            if visgym is not None:
                v = statistics.median(theirs)
            else:
                v = 1000 * VISGYM_FIXED_MS[preset][0 if what == "reset" else 1]
            out.write(f"{preset + ' ' + label + ' (us)':<30}{o:>10.1f}{v:>10.0f}{o / v:>8.3f}\n")
    env = MazeEnv("easy")
    env.reset(seed=0)
    renderer = Renderer(env.maze)
    png = _per_call_us(lambda i: renderer.data_uri(), seconds)
    out.write(f"{'easy PNG data URI (us)':<30}{png:>10.1f}{'-':>10}{'-':>8}\n")
    reply = "<observation>wall above</observation><justification>goal is right</justification><action>right</action>"
    parse = _per_call_us(lambda i: parse_action(reply), seconds)
    out.write(f"{'parse tagged reply (us)':<30}{parse:>10.2f}{'-':>10}{'-':>8}\n")
    if visgym is not None:
        out.write(f"VisGym run beside it in one run: {visgym.where}\n")
    else:
        out.write(
            "* VisGym was NOT run (no --visgym checkout given): its column is the fixed figure "
            "once measured on these machines, so the ratio is only indicative.\n"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Print the timing table to stdout."""
    parser = argparse.ArgumentParser(description="time reset+render and step beside VisGym's")
    parser.add_argument("--seconds", type=float, default=1.0, help="time budget per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternations per measurement")
    parser.add_argument("--visgym", type=Path, help="a VisGym checkout (holds gymnasium/)")
    parser.add_argument(
        "--visgym-python", default=sys.executable, help="interpreter with numpy and pygame"
    )
    args = parser.parse_args(argv)
    visgym = VisGym(args.visgym, args.visgym_python) if args.visgym else None
    try:
        run_bench(args.seconds, args.rounds, visgym, sys.stdout)
    finally:
        if visgym is not None:
            visgym.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
