"""What a policy decided in its episodes: first moves, stops and recoveries, by layout class.

Episodes are replayed from their recorded replies with maze-env's own rules, so the figures
come from the run's records, not from a second rollout. A decision is *good* when it keeps the
agent on a shortest path: the distance to the goal (BFS over open squares) drops by one, or the
agent stops on the goal. The layout class of a maze is its start corner and how many first
moves are good (1 = the walls leave one way out; 2 = either way is as short).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from maze_env import Maze
    from maze_policy.policy import Policy
    from maze_policy.rollout import Episode

Pos = tuple[int, int]
EVALS_DIR = "evals"
"""Under the run directory: one ``step_<N>.jsonl`` of episodes per evaluation."""
DECISIONS_FILE = "decisions.md"
"""Under the run directory: the first evaluation's decisions against the last one's."""


@dataclass(frozen=True, slots=True)
class Replayed:
    """One episode's decisions."""

    layout_class: str
    first_move_good: bool | None
    """None when the first reply was not a move (invalid or stop)."""
    reached_goal: bool
    stopped_on_arrival: bool | None
    """On the turn after first reaching the goal: stopped (True), or not (False); None if never."""
    bumps: int
    recoveries: int
    """Bumps followed by a good move on the next turn."""
    solved: bool
    forks: int = 0
    """Turns taken on a fork: a square with more than one open way besides the one the agent
    came from (the decisions that need the route, not just the walls)."""
    forks_good: int = 0
    """Of those, the turns that moved along a shortest path."""
    good_turns: tuple[bool, ...] = ()
    """Per played turn: moved one square closer to the goal, or stopped on it."""
    stopped_off_goal: bool = False
    """The episode ended on a stop away from the goal (its last played turn)."""


def distances(maze: Maze) -> dict[Pos, int]:
    """BFS distance to the goal of every open square."""
    out = {maze.goal: 0}
    frontier = [maze.goal]
    while frontier:
        nxt: list[Pos] = []
        for r, c in frontier:
            for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                p = (r + dr, c + dc)
                if maze.is_open(p) and p not in out:
                    out[p] = out[(r, c)] + 1
                    nxt.append(p)
        frontier = nxt
    return out


def layout_class(maze: Maze, dist: Mapping[Pos, int] | None = None) -> str:
    """``<corner>/<k> way(s)``: the start corner and how many first moves are on a shortest path."""
    dist = dist or distances(maze)
    rows, cols = maze.shape
    r, c = maze.start
    corner = ("top" if r < rows // 2 else "bottom") + "-" + ("left" if c < cols // 2 else "right")
    ways = sum(
        1
        for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1))
        if dist.get((r + dr, c + dc), 10**9) == dist[maze.start] - 1
    )
    return f"{corner}/{ways} way{'s' if ways != 1 else ''}"


def good_turns(maze: Maze, replies: Sequence[str], step_budget: int) -> list[bool]:
    """Per played turn: did it move one square closer to the goal, or stop on the goal?

    The verifier's dense view of an episode (:attr:`Replayed.good_turns`): one verdict per turn
    the game took (turns after the episode ended are not played).
    """
    return list(replay(maze, replies, step_budget).good_turns)


def turn_rewards(
    maze: Maze, replies: Sequence[str], step_budget: int, *, off_goal_stop_penalty: float = 0.0
) -> list[float]:
    """Per played turn: 1 if good (:func:`good_turns`), -penalty for a stop off the goal, else 0.

    A stop off the goal ends the episode, where a bump only wastes a turn; at 0 the two score
    alike, and the penalty tells them apart.
    """
    played = replay(maze, replies, step_budget)
    out = [float(g) for g in played.good_turns]
    if played.stopped_off_goal:
        out[-1] = -off_goal_stop_penalty
    return out


def replay(maze: Maze, replies: Sequence[str], step_budget: int) -> Replayed:
    """Replay ``replies`` on ``maze`` and classify every decision."""
    from maze_env import MazeGame
    from maze_env.agents import moved, open_ways

    dist = distances(maze)
    game = MazeGame.start(maze, step_budget)
    first: bool | None = None
    arrived_at: int | None = None
    stopped_on_arrival: bool | None = None
    bumps = recoveries = forks = forks_good = 0
    last_bumped = False
    came_from: Pos | None = None
    turns_good: list[bool] = []
    stopped_off_goal = False
    for turn, reply in enumerate(replies):
        if game.done:
            break
        before = game.agent
        ways_on = [p for d in open_ways(maze, before) if (p := moved(before, d)) != came_from]
        result = game.step(reply)
        good = result.outcome == "moved" and dist[game.agent] == dist[before] - 1
        turns_good.append(good or (result.outcome == "stopped" and before == maze.goal))
        stopped_off_goal = result.outcome == "stopped" and before != maze.goal
        if len(ways_on) > 1 and before != maze.goal:
            forks += 1
            forks_good += good
        if result.outcome == "moved":
            came_from = before
        if turn == 0:
            first = good if result.outcome in ("moved", "bumped") else None
        if last_bumped:
            recoveries += good
        last_bumped = result.outcome == "bumped"
        bumps += last_bumped
        if arrived_at is not None and turn == arrived_at + 1:
            stopped_on_arrival = result.outcome == "stopped"
        if arrived_at is None and game.agent == maze.goal:
            arrived_at = turn
    if arrived_at is not None and stopped_on_arrival is None and not game.done:
        stopped_on_arrival = False
    return Replayed(
        layout_class=layout_class(maze, dist),
        first_move_good=first,
        reached_goal=arrived_at is not None,
        stopped_on_arrival=stopped_on_arrival,
        bumps=bumps,
        recoveries=recoveries,
        solved=game.solved,
        forks=forks,
        forks_good=forks_good,
        good_turns=tuple(turns_good),
        stopped_off_goal=stopped_off_goal,
    )


def _rate(values: Iterable[bool | None]) -> tuple[float | None, int]:
    seen = [bool(v) for v in values if v is not None]
    return (sum(seen) / len(seen) if seen else None, len(seen))


def first_move_good(firsts: Iterable[bool | None]) -> float | None:
    """The share of episodes whose first reply moved along a shortest path.

    A first reply that is no move (invalid, or ``stop``) counts as a bad first move: the rate
    is over every episode, so a model cannot raise it by answering fewer moves.
    """
    seen = [bool(f) for f in firsts]
    return sum(seen) / len(seen) if seen else None


def summarize(episodes: Sequence[Replayed]) -> dict[str, Any]:
    """Rates over ``episodes``, overall and per layout class (with how many counted)."""
    by_class: dict[str, list[Replayed]] = defaultdict(list)
    for e in episodes:
        by_class[e.layout_class].append(e)

    def block(group: Sequence[Replayed]) -> dict[str, Any]:
        stop, n_stop = _rate(e.stopped_on_arrival for e in group)
        bumps = sum(e.bumps for e in group)
        forks = sum(e.forks for e in group)
        return {
            "episodes": len(group),
            "solved": sum(e.solved for e in group) / len(group) if group else None,
            "first_move_good": first_move_good(e.first_move_good for e in group),
            "fork_good": sum(e.forks_good for e in group) / forks if forks else None,
            "forks": forks,
            "stop_on_arrival": stop,
            "arrivals": n_stop,
            "bumps": bumps,
            "recovery_after_bump": sum(e.recoveries for e in group) / bumps if bumps else None,
        }

    return {"all": block(episodes), **{k: block(v) for k, v in sorted(by_class.items())}}


def first_moves(
    policy: Policy,
    eval_set: str,
    *,
    cell_px: int,
    max_new_tokens: int = 32,
    slack: int | None = None,
) -> list[bool | None]:
    """Whether the greedy first reply on each of ``eval_set``'s mazes is a good move (in order).

    One turn per maze, so it is cheap enough to run during training: the route choice is the
    decision the loss hides (about one token of an episode's ~100). ``slack`` sets the turn
    budget the prompt states (maze-env's default if None): the replies depend on it.
    """
    from maze_env import DEFAULT_SLACK, get_eval_set
    from maze_env.export import build_rows
    from maze_env.render import Style
    from maze_policy.rollout import run_episodes
    from maze_policy.sampling import SamplingParams

    es = get_eval_set(eval_set)
    rows = build_rows(
        es.spec,
        es.seeds,
        split="validation",
        slack=DEFAULT_SLACK if slack is None else slack,
        style=Style(cell_px=cell_px),
    )
    eps = run_episodes(
        policy,
        rows,
        sampling=SamplingParams(greedy=True, max_new_tokens=max_new_tokens),
        seed=0,
        max_turns=1,
    )
    return [
        replay(maze, ep.replies[:1], maze.step_budget()).first_move_good
        for maze, ep in zip(es.mazes, eps, strict=True)
    ]


def first_move_rates(
    policy: Policy,
    eval_set: str,
    *,
    cell_px: int,
    max_new_tokens: int = 32,
    slack: int | None = None,
) -> dict[str, float]:
    """:func:`first_moves` as :func:`first_move_good` rates: ``all`` and one per layout class."""
    from maze_env import get_eval_set

    mazes = get_eval_set(eval_set).mazes
    good = first_moves(
        policy, eval_set, cell_px=cell_px, max_new_tokens=max_new_tokens, slack=slack
    )
    by_class: dict[str, list[bool | None]] = defaultdict(list)
    for maze, g in zip(mazes, good, strict=True):
        by_class[layout_class(maze)].append(g)
    rates: dict[str, float] = {}
    for key, firsts in [("all", good), *sorted(by_class.items())]:
        rate = first_move_good(firsts)
        assert rate is not None  # an eval set has mazes, each class at least one
        rates[key] = rate
    return rates


def write_eval_records(
    path: Path, rows: Sequence[Mapping[str, Any]], episodes: Sequence[Episode]
) -> None:
    """One JSON line per eval episode: the maze's preset, seed and budget, the replies, solved."""
    from weight_sync import fs

    lines = [
        json.dumps(
            {
                "preset": rows[e.row_index]["preset"],
                "seed": int(rows[e.row_index]["seed"]),
                "step_budget": int(rows[e.row_index]["step_budget"]),
                "replies": list(e.replies),
                "solved": bool(e.solved),
            }
        )
        for e in episodes
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    fs.atomic_write_text(path, "".join(f"{line}\n" for line in lines), durable=False)


def read_eval_records(path: Path) -> list[Replayed]:
    """Replay every episode of an eval record file."""
    from maze_env import generate

    out: list[Replayed] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        maze = generate(str(rec["preset"]), int(rec["seed"]))
        out.append(replay(maze, list(rec["replies"]), int(rec["step_budget"])))
    return out


def compare_table(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """A Markdown table of every rate, before -> after, overall and per layout class."""

    def pct(x: object) -> str:
        return "-" if x is None else f"{float(x):.0%}"  # pyright: ignore[reportArgumentType]

    lines = [
        "| layout class | episodes | solved | first move good | good at forks | stop on arrival "
        "| recovery after bump |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in after:
        b, a = before.get(key, {}), after[key]
        cells = [
            f"{pct(b.get(m))} -> {pct(a.get(m))}"
            for m in (
                "solved",
                "first_move_good",
                "fork_good",
                "stop_on_arrival",
                "recovery_after_bump",
            )
        ]
        lines.append(f"| {key} | {a['episodes']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_decisions_report(run_dir: Path) -> Path | None:
    """Write ``decisions.md``: what changed between the run's first and last evaluation.

    Read from the run's own records (``evals/step_<N>.jsonl``); None when fewer than two
    evaluations were recorded.
    """
    from weight_sync import fs

    records = sorted(
        (int(p.stem.removeprefix("step_")), p)
        for p in (run_dir / EVALS_DIR).glob("step_*.jsonl")
        if p.stem.removeprefix("step_").isdigit()
    )
    if len(records) < 2:
        return None
    (first, before), (last, after) = records[0], records[-1]
    table = compare_table(summarize(read_eval_records(before)), summarize(read_eval_records(after)))
    text = (
        f"# Decisions: global step {first} -> {last}\n\n"
        f"Greedy evaluation episodes replayed from `{EVALS_DIR}/{before.name}` and "
        f"`{EVALS_DIR}/{after.name}`; a decision is good when it keeps the agent on a shortest "
        "path. A fork is a square with more than one open way besides the one the agent came "
        "from: its decision needs the route, not just the walls.\n\n"
        f"{table}\n"
    )
    out = run_dir / DECISIONS_FILE
    fs.atomic_write_text(out, text, durable=False)
    return out
