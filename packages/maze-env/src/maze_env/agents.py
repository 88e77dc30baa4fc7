"""Scripted agents: baselines, and demonstrators for supervised warm starts.

``ExplorerAgent`` reads every wall next to it, never bumps and stops on the goal, but plans
nothing: at a fork it takes one of the ways on at random and it turns back only at a dead
end. It is what a perfect reader without planning does, so its solve rate under a turn budget
is what reading alone is worth; the shortest route (``Maze.optimal_actions``) is the planner's.
"""

from __future__ import annotations

import random

from maze_env.actions import DIRECTION_DELTAS, Direction
from maze_env.maze import Maze, Pos

OPPOSITE: dict[Direction, Direction] = {
    Direction.UP: Direction.DOWN,
    Direction.DOWN: Direction.UP,
    Direction.LEFT: Direction.RIGHT,
    Direction.RIGHT: Direction.LEFT,
}


def moved(pos: Pos, direction: Direction) -> Pos:
    """The square one step from ``pos`` in ``direction``."""
    dr, dc = DIRECTION_DELTAS[direction]
    return (pos[0] + dr, pos[1] + dc)


def open_ways(maze: Maze, pos: Pos) -> list[Direction]:
    """Directions from ``pos`` into an open square, in ``Direction`` order."""
    return [d for d in DIRECTION_DELTAS if maze.is_open(moved(pos, d))]


class ExplorerAgent:
    """A wall reader that explores at random: see the module docstring.

    ``act`` is told where the agent stands and answers an action word (``right``, ``up``,
    ``left``, ``down`` or ``stop``); it remembers the way it came, so call it once per turn
    and only with the squares its own moves reached.
    """

    def __init__(self, maze: Maze, rng: random.Random) -> None:
        self.maze = maze
        self.rng = rng
        self._back: Direction | None = None

    def act(self, pos: Pos) -> str:
        if pos == self.maze.goal:
            return "stop"
        ways = open_ways(self.maze, pos)
        if not ways:
            raise ValueError(f"no open square next to {pos}: not a square of this maze")
        on = [d for d in ways if d != self._back] or ways
        choice = self.rng.choice(on)
        self._back = OPPOSITE[choice]
        return choice.word
