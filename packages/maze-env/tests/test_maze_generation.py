from collections import Counter, deque

import numpy as np
import pytest

from maze_env import GENERATORS, Direction, MazeSpec, MazeSpecError, generate
from maze_env.actions import DIRECTION_DELTAS
from maze_env.evalsets import get_eval_set


def _open_component(walls: np.ndarray, start: tuple[int, int]) -> set[tuple[int, int]]:
    seen = {start}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        for dr, dc in DIRECTION_DELTAS.values():
            n = (r + dr, c + dc)
            if not walls[n] and n not in seen:
                seen.add(n)
                queue.append(n)
    return seen


@pytest.mark.parametrize("generator", GENERATORS)
@pytest.mark.parametrize("size", [(5, 5), (9, 9), (11, 15), (21, 21)])
def test_every_generator_makes_a_perfect_maze(generator: str, size: tuple[int, int]) -> None:
    for seed in range(5):
        maze = generate(MazeSpec(size[0], size[1], generator), seed)  # type: ignore[arg-type]
        walls = maze.walls
        assert walls[0].all() and walls[-1].all() and walls[:, 0].all() and walls[:, -1].all()
        open_squares = {(int(r), int(c)) for r, c in zip(*np.nonzero(~walls), strict=True)}
        # Connected, and a tree: open squares = edges + 1 when each square links to its neighbours.
        assert _open_component(walls, maze.start) == open_squares
        edges = sum(
            1
            for r, c in open_squares
            for dr, dc in ((0, 1), (1, 0))
            if (r + dr, c + dc) in open_squares
        )
        assert edges == len(open_squares) - 1
        assert {maze.start, maze.goal} <= open_squares


def test_generation_is_deterministic_and_seed_sensitive() -> None:
    a, b = generate("easy", 42), generate("easy", 42)
    assert np.array_equal(a.walls, b.walls) and a.start == b.start and a.goal == b.goal
    layouts = {generate("easy", s).content_hash() for s in range(50)}
    assert len(layouts) > 45


def test_easy64_optimal_moves_and_reference_flaw() -> None:
    mazes = get_eval_set("easy-64").mazes
    assert Counter(m.optimal_moves for m in mazes) == {12: 50, 16: 14}
    # The reference ran with max_turns 15: a 16-move maze needs 17 turns with the stop.
    assert sum(m.optimal_moves + 1 <= 15 for m in mazes) == 50
    assert all(m.step_budget() == m.optimal_moves + 1 + 4 for m in mazes)
    assert all(m.step_budget(0) == m.optimal_moves + 1 for m in mazes)


def test_optimal_actions_walk_the_shortest_path() -> None:
    maze = generate("hard", 3)
    pos = maze.start
    for d in maze.optimal_actions:
        dr, dc = DIRECTION_DELTAS[d]
        pos = (pos[0] + dr, pos[1] + dc)
        assert maze.is_open(pos)
    assert pos == maze.goal
    assert len(maze.optimal_actions) == maze.optimal_moves
    assert all(isinstance(d, Direction) for d in maze.optimal_actions)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("8x8", "odd"),
        ("3x3", ">= 5"),
        ("999x999", "<= 201"),
        ("easy:bogus", "unknown generator"),
        ("medium", "cannot parse"),
    ],
)
def test_bad_specs_get_clear_errors(text: str, message: str) -> None:
    with pytest.raises(MazeSpecError, match=message):
        MazeSpec.parse(text)


@pytest.mark.parametrize("seed", [-1, 1.5, True, "3"])
def test_bad_seeds_are_refused(seed: object) -> None:
    with pytest.raises(MazeSpecError, match="seed"):
        generate("easy", seed)  # type: ignore[arg-type]


def test_spec_names_round_trip() -> None:
    for text in ("easy", "hard", "13x15", "13x15:dfs", "easy:prim"):
        spec = MazeSpec.parse(text)
        assert MazeSpec.parse(spec.name) == spec
    assert MazeSpec.parse("9x9").name == "easy"


def test_maze_walls_are_read_only() -> None:
    maze = generate("easy", 1)
    with pytest.raises(ValueError, match="read-only"):
        maze.walls[0, 0] = False
