import random

import pytest

from maze_env import Direction, MazeGame, generate, get_eval_set
from maze_env.agents import OPPOSITE, ExplorerAgent, moved, open_ways
from maze_env.maze import Maze


def _play(maze: Maze, rng: random.Random, budget: int = 200) -> tuple[MazeGame, list[str]]:
    game, agent = MazeGame.start(maze, budget), ExplorerAgent(maze, rng)
    words: list[str] = []
    while not game.done:
        words.append(agent.act(game.agent))
        assert game.step(words[-1]).outcome in ("moved", "stopped")  # never bumps
    return game, words


def test_the_explorer_reads_walls_stops_on_the_goal_and_turns_back_only_at_dead_ends() -> None:
    rng = random.Random(0)
    turned_back = 0
    for maze in get_eval_set("small-64").mazes[:16]:
        game, words = _play(maze, rng)
        assert game.solved and words[-1] == "stop"  # a perfect maze: exploring always arrives
        pos, last = maze.start, None
        for word in words[:-1]:
            step = Direction[word.upper()]
            if last is not None and step == OPPOSITE[last]:
                assert len(open_ways(maze, pos)) == 1  # only a dead end sends it back
                turned_back += 1
            pos, last = moved(pos, step), step
    assert turned_back > 0


def test_the_explorer_is_a_partial_solver_under_a_tight_budget() -> None:
    mazes = get_eval_set("small-64").mazes
    rng = random.Random(1)
    solved = sum(_play(m, rng, m.step_budget(2))[0].solved for m in mazes for _ in range(8))
    assert 0.2 < solved / (8 * len(mazes)) < 0.6  # ~37% (benchmarks/scripted_policies.py)


def test_the_explorer_refuses_a_square_outside_the_maze() -> None:
    maze = generate("5x5", 0)
    with pytest.raises(ValueError, match="no open square"):
        ExplorerAgent(maze, random.Random(0)).act((0, 0))


def test_layout_hash_ignores_corners_and_content_hash_does_not() -> None:
    maze = generate("7x7", 3)
    other = Maze(walls=maze.walls, start=maze.goal, goal=maze.start, spec=maze.spec)
    assert other.layout_hash() == maze.layout_hash()
    assert other.content_hash() != maze.content_hash()
    assert generate("7x7", 4).layout_hash() != maze.layout_hash()
