"""What reading the walls right is worth without planning: scripted policies on an eval set.

    uv run python packages/maze-engine/benchmarks/scripted_policies.py --eval-set small-64 \
        --slack 2 4 8 16

Each policy sees every wall next to the agent, never bumps and stops on the goal; none looks
further than one square. ``explorer`` picks uniformly among the open ways on at each fork and
turns back only at a dead end (its solve rate is estimated from ``--samples`` episodes per maze,
pass@8 from that rate); ``left-hand`` and ``right-hand`` follow one wall. The episode gets the
eval's turn budget, ``optimal_moves + 1 + slack`` turns, the last one ``stop``. A model that
reads its surroundings perfectly but plans nothing scores about the explorer; a planner scores
100%. It also prints what the shortest routes ask for: forks on the way and forced first moves.
"""

from __future__ import annotations

import argparse
import random
import statistics

from maze_env import get_eval_set
from maze_env.actions import Direction
from maze_env.agents import OPPOSITE as _OPPOSITE
from maze_env.agents import ExplorerAgent
from maze_env.agents import moved as _moved
from maze_env.agents import open_ways as _open_ways
from maze_env.maze import Maze

# Counter-clockwise order: turning left from a heading is the next entry.
_CCW = (Direction.UP, Direction.LEFT, Direction.DOWN, Direction.RIGHT)


def explorer_solves(maze: Maze, moves: int, rng: random.Random) -> bool:
    """One episode of maze-env's explorer within ``moves`` moves (the budget less the ``stop``)."""
    agent, pos = ExplorerAgent(maze, rng), maze.start
    for _ in range(moves):
        if pos == maze.goal:
            return True
        pos = _moved(pos, Direction[agent.act(pos).upper()])
    return pos == maze.goal


def wall_follower_solves(maze: Maze, moves: int, hand: str) -> bool:
    """Keep one hand on the wall: try that side, then straight, the other side, then back."""
    turn = 1 if hand == "left" else -1
    pos = maze.start
    # Facing away from the wall behind the start, as if it had just walked in.
    heading = _OPPOSITE[_open_ways(maze, pos)[0]]
    for _ in range(moves):
        if pos == maze.goal:
            return True
        i = _CCW.index(heading)
        for k in (turn, 0, -turn, 2):
            d = _CCW[(i + k) % 4]
            if maze.is_open(_moved(pos, d)):
                pos, heading = _moved(pos, d), d
                break
    return pos == maze.goal


def _forks_on_route(maze: Maze) -> int:
    """Squares of the shortest route where more than one way leads on."""
    forks = 0
    for i, pos in enumerate(maze.shortest_path[:-1]):
        ways_on = len(_open_ways(maze, pos)) - (1 if i else 0)
        forks += ways_on >= 2
    return forks


def main() -> None:
    """Print each policy's solve rate per slack, then what the shortest routes ask for."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("--eval-set", default="small-64")
    ap.add_argument("--slack", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--samples", type=int, default=2000, help="explorer episodes per maze")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.samples < 1:
        ap.error(f"--samples must be >= 1, got {args.samples}")
    if any(s < 0 for s in args.slack):
        ap.error(f"--slack must be >= 0, got {args.slack}")
    mazes = list(get_eval_set(args.eval_set).mazes)
    rng = random.Random(args.seed)
    print(f"{args.eval_set}: {len(mazes)} mazes, {args.samples} explorer episodes each")
    print("| slack | explorer pass@1 | explorer pass@8 | left-hand | right-hand |")
    print("|---:|---:|---:|---:|---:|")
    for slack in args.slack:
        rates: list[float] = []
        left = right = 0
        for maze in mazes:
            moves = maze.step_budget(slack) - 1
            rates.append(
                sum(explorer_solves(maze, moves, rng) for _ in range(args.samples)) / args.samples
            )
            left += wall_follower_solves(maze, moves, "left")
            right += wall_follower_solves(maze, moves, "right")
        pass1 = statistics.mean(rates)
        pass8 = statistics.mean(1 - (1 - r) ** 8 for r in rates)
        n = len(mazes)
        print(f"| {slack} | {pass1:.2%} | {pass8:.2%} | {left / n:.2%} | {right / n:.2%} |")
    forks = [_forks_on_route(m) for m in mazes]
    forced = sum(len(_open_ways(m, m.start)) == 1 for m in mazes)
    print(
        f"forks on the shortest route: mean {statistics.mean(forks):.2f}, "
        f"min {min(forks)}, max {max(forks)}; first move forced on {forced} of {len(mazes)}; "
        f"optimal moves mean {statistics.mean(m.optimal_moves for m in mazes):.2f}"
    )


if __name__ == "__main__":
    main()
