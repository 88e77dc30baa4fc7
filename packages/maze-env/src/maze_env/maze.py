"""The maze itself: layout, start and goal, optimal solution and step budget."""

from __future__ import annotations

import functools
import hashlib
import random
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from maze_env.actions import DIRECTION_DELTAS, Direction
from maze_env.errors import MazeEnvError
from maze_env.generators import CARVERS, GENERATORS, GeneratorName

Pos = tuple[int, int]

DEFAULT_SLACK = 4
"""Extra turns beyond ``optimal moves + stop`` in the default step budget."""


class MazeSpecError(MazeEnvError, ValueError):
    """A maze size, preset or generator name that cannot be built."""


@dataclass(frozen=True, slots=True)
class MazeSpec:
    """How to build mazes: grid size including the outer wall, and the carving algorithm.

    ``rows`` and ``cols`` count grid squares (walls and paths), as VisGym's ``maze_height`` and
    ``maze_width`` do: ``easy`` is 9x9 squares holding 4x4 cells.
    """

    rows: int
    cols: int
    generator: GeneratorName = "wilson"

    def __post_init__(self) -> None:
        for name, value in (("rows", self.rows), ("cols", self.cols)):
            if isinstance(value, bool) or not isinstance(value, int):  # pyright: ignore[reportUnnecessaryIsInstance] - user input
                raise MazeSpecError(f"{name} must be an int, got {value!r}")
            if value < 5 or value % 2 == 0:
                raise MazeSpecError(
                    f"{name} must be odd and >= 5 (outer wall + 2x2 cells), got {value}"
                )
            if value > 201:
                raise MazeSpecError(f"{name} must be <= 201, got {value}")
        if self.generator not in GENERATORS:
            raise MazeSpecError(
                f"unknown generator {self.generator!r}; choose one of {', '.join(GENERATORS)}"
            )

    @property
    def name(self) -> str:
        for preset, spec in PRESETS.items():
            if spec == self:
                return preset
        suffix = "" if self.generator == "wilson" else f":{self.generator}"
        return f"{self.rows}x{self.cols}{suffix}"

    @classmethod
    def parse(cls, text: str) -> MazeSpec:
        """Parse ``easy``, ``hard``, ``13x13`` or ``13x13:dfs`` (also ``easy:prim``)."""
        base, _, gen = text.strip().lower().partition(":")
        generator = gen or "wilson"
        if generator not in GENERATORS:
            raise MazeSpecError(
                f"unknown generator {generator!r} in {text!r}; choose one of {', '.join(GENERATORS)}"
            )
        if base in PRESETS:
            preset = PRESETS[base]
            return cls(preset.rows, preset.cols, generator)  # type: ignore[arg-type]
        m = re.fullmatch(r"(\d{1,3})x(\d{1,3})", base)
        if m is None:
            raise MazeSpecError(
                f"cannot parse maze spec {text!r}: use a preset ({', '.join(PRESETS)}) or ROWSxCOLS[:generator]"
            )
        return cls(int(m.group(1)), int(m.group(2)), generator)  # type: ignore[arg-type]


PRESETS: dict[str, MazeSpec] = {
    # Same sizes as VisGym's maze_2d/easy and maze_2d/hard.
    "easy": MazeSpec(9, 9),
    "hard": MazeSpec(11, 11),
}


@dataclass(frozen=True, eq=False)
class Maze:
    """One maze. ``walls[r, c]`` is True for a wall square; positions are ``(row, col)``, top row 0."""

    walls: npt.NDArray[np.bool_]
    start: Pos
    goal: Pos
    spec: MazeSpec
    seed: int | None = None

    def __post_init__(self) -> None:
        self.walls.setflags(write=False)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.walls.shape[0]), int(self.walls.shape[1]))

    def is_open(self, pos: Pos) -> bool:
        r, c = pos
        return (
            0 <= r < self.walls.shape[0] and 0 <= c < self.walls.shape[1] and not self.walls[r, c]
        )

    @cached_property
    def shortest_path(self) -> tuple[Pos, ...]:
        """A shortest start-to-goal path (BFS), both ends included."""
        return _bfs(self.walls, self.start, self.goal)

    @cached_property
    def optimal_moves(self) -> int:
        return len(self.shortest_path) - 1

    @cached_property
    def optimal_actions(self) -> tuple[Direction, ...]:
        out: list[Direction] = []
        for (r0, c0), (r1, c1) in zip(self.shortest_path, self.shortest_path[1:], strict=False):
            out.append(_DELTA_TO_DIRECTION[(r1 - r0, c1 - c0)])
        return tuple(out)

    def step_budget(self, slack: int = DEFAULT_SLACK) -> int:
        """Turns that always suffice: every optimal move, one ``stop``, plus ``slack``."""
        if slack < 0:
            raise ValueError(f"slack must be >= 0, got {slack}")
        return self.optimal_moves + 1 + slack

    def grid_rows(self) -> list[str]:
        """The layout as strings, ``#`` wall and ``.`` free, top row first."""
        return ["".join("#" if w else "." for w in row) for row in self.walls.tolist()]

    def to_dict(self, slack: int = DEFAULT_SLACK) -> dict[str, Any]:
        return {
            "grid": self.grid_rows(),
            "start": list(self.start),
            "goal": list(self.goal),
            "optimal_moves": self.optimal_moves,
            "step_budget": self.step_budget(slack),
        }

    def layout_hash(self) -> str:
        """sha256 over the walls alone: one layout whatever its start and goal.

        What held-out checks compare: a training maze that shares an eval maze's walls, with
        other corners, still shows the model that layout's routes.
        """
        h = hashlib.sha256()
        h.update(f"{self.shape[0]}x{self.shape[1]}|".encode())
        h.update(np.packbits(self.walls).tobytes())
        return h.hexdigest()

    def content_hash(self) -> str:
        """sha256 over layout, start and goal: identifies the maze independent of how it was made."""
        h = hashlib.sha256()
        h.update(f"{self.shape[0]}x{self.shape[1]}|{self.start}|{self.goal}|".encode())
        h.update(np.packbits(self.walls).tobytes())
        return h.hexdigest()


_DELTA_TO_DIRECTION = {delta: d for d, delta in DIRECTION_DELTAS.items()}


def _bfs(walls: npt.NDArray[np.bool_], start: Pos, goal: Pos) -> tuple[Pos, ...]:
    # Flat indices over a bytes copy and a list as queue: per-element numpy indexing and deque
    # calls would dominate reset time. One ``blocked`` byte per square (wall, or already
    # reached) makes the inner test a single lookup. The outer wall keeps every neighbour
    # index in range.
    rows, cols = walls.shape
    blocked = bytearray(walls.tobytes())
    src, dst = start[0] * cols + start[1], goal[0] * cols + goal[1]
    steps = (1, -cols, -1, cols)
    prev = [0] * (rows * cols)
    blocked[src] = 1
    queue = [src]
    for cur in queue:  # the list grows while iterated: a FIFO without deque overhead
        if cur == dst:
            node, path = cur, [divmod(cur, cols)]
            while node != src:
                node = prev[node]
                path.append(divmod(node, cols))
            return tuple(reversed(path))
        for step in steps:
            nxt = cur + step
            if not blocked[nxt]:
                blocked[nxt] = 1
                prev[nxt] = cur
                queue.append(nxt)
    raise ValueError(f"goal {goal} is unreachable from {start}")


@functools.cache
def _corner_pairs(rows: int, cols: int) -> tuple[tuple[Pos, Pos], ...]:
    # VisGym's four opposite-corner (start, goal) pairs, in its order.
    lo, br, bc = 1, rows - 2, cols - 2
    return (
        ((lo, lo), (br, bc)),
        ((br, bc), (lo, lo)),
        ((br, lo), (lo, bc)),
        ((lo, bc), (br, lo)),
    )


def generate(spec: MazeSpec | str = "easy", seed: int | None = None) -> Maze:
    """Build the maze for ``seed``, drawing exactly as VisGym's ``reset(seed)`` does.

    numpy's PCG64 generator seeded with ``seed`` (gymnasium's ``np_random``) first draws a 32-bit
    seed for the carver's ``random.Random``, then the index of the start/goal corner pair.
    ``seed=None`` draws fresh OS entropy.
    """
    if isinstance(spec, str):
        spec = MazeSpec.parse(spec)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):  # pyright: ignore[reportUnnecessaryIsInstance] - user input
        raise MazeSpecError(f"seed must be a non-negative int or None, got {seed!r}")
    return generate_from(spec, np.random.default_rng(seed), seed)


def generate_from(spec: MazeSpec, np_rng: np.random.Generator, seed: int | None = None) -> Maze:
    """Draw the next maze from ``np_rng`` as VisGym's env does from its ``np_random``.

    Successive calls on one generator reproduce VisGym's successive unseeded resets.
    ``seed`` is only recorded on the maze.
    """
    carver_seed = int(np_rng.integers(2**32))
    interior = CARVERS[spec.generator](spec.rows - 2, spec.cols - 2, random.Random(carver_seed))
    walls = np.ones((spec.rows, spec.cols), dtype=np.bool_)
    walls[1:-1, 1:-1] = ~interior
    start, goal = _corner_pairs(spec.rows, spec.cols)[int(np_rng.integers(0, 4))]
    return Maze(walls=walls, start=start, goal=goal, spec=spec, seed=seed)
