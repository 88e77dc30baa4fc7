"""Layouts, starts and goals match VisGym's own generator for the same seeds.

tests/data/visgym_parity.json was produced by running VisGym's WilsonMazeGenerator and the
reset logic of gymnasium/envs/maze_2d/maze_2d.py (visgym/VisGym) under numpy's PCG64 seeding:
easy seeds 0..63 plus 1000, 12345, 2**31-1; hard seeds 0..31 plus the same three; and four
successive unseeded resets after reset(seed=7).
"""

import json
from pathlib import Path
from typing import Any

import pytest

from maze_env import Maze, MazeSpec, generate
from maze_env.env import MazeEnv

REF: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "visgym_parity.json").read_text()
)
CASES = [(preset, int(seed)) for preset in ("easy", "hard") for seed in REF[preset]]


@pytest.mark.parametrize(("preset", "seed"), CASES)
def test_generate_matches_visgym(preset: str, seed: int) -> None:
    ref = REF[preset][str(seed)]
    maze = generate(preset, seed)
    assert maze.grid_rows() == ref["grid"]
    assert list(maze.start) == ref["start"]
    assert list(maze.goal) == ref["goal"]


def test_gym_env_reset_matches_visgym_for_seeded_and_successive_unseeded_resets() -> None:
    env = MazeEnv("easy")
    got: list[Maze] = []
    env.reset(seed=7)
    got.append(env.maze)
    for _ in range(3):
        env.reset()
        got.append(env.maze)
    refs: list[dict[str, Any]] = REF["sequence_easy_seed7"]
    for maze, ref in zip(got, refs, strict=True):
        assert maze.grid_rows() == ref["grid"]
        assert [list(maze.start), list(maze.goal)] == [ref["start"], ref["goal"]]
    assert got[0].seed == 7
    assert got[1].seed is None


def test_presets_are_visgym_sizes() -> None:
    assert MazeSpec.parse("easy") == MazeSpec(9, 9, "wilson")
    assert MazeSpec.parse("hard") == MazeSpec(11, 11, "wilson")
