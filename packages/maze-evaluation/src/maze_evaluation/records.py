"""One result record per (maze, sample), and how a finished episode becomes one.

Scoring is maze-verifier's (:func:`score_episode`, the very function the env calls) and the
path is a replay with maze-env's :class:`MazeGame`, so no episode rule lives here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from maze_env import MAX_ACTION_CHARS, Maze, MazeGame, generate, parse_action
from maze_verifier import score_episode

FailureKind = Literal["solved", "wrong_stop", "out_of_budget", "unfinished"]
FAILURE_KINDS: tuple[FailureKind, ...] = ("solved", "wrong_stop", "out_of_budget", "unfinished")
REPLY_CHARS = 300
"""Replies are stored truncated to this many characters: enough to read, small on disk."""


@dataclass(frozen=True, slots=True)
class EvalRecord:
    """The outcome of one episode. ``path`` lists every square the agent stood on, in order."""

    eval_set: str
    preset: str
    seed: int
    sample: int
    solved: bool
    reward: float
    turns: int
    moves: int
    optimal_moves: int
    step_budget: int
    failure: FailureKind
    bumps: int
    loops: int
    """Moves that landed on an already visited square."""
    parse_failures: int
    parse_failure_codes: list[str]
    path: list[list[int]]
    replies: list[str]
    backend: str
    model: str
    adapter: str | None
    version: int | None
    elapsed_s: float
    extra: dict[str, Any] = field(default_factory=dict[str, Any])

    @property
    def key(self) -> tuple[int, int]:
        return (self.seed, self.sample)

    def maze(self) -> Maze:
        return generate(self.preset, self.seed)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EvalRecord:
        names = set(cls.__dataclass_fields__)
        missing = names - set(data) - {"extra"}
        if missing:
            raise KeyError(f"record lacks {sorted(missing)}")
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True, slots=True)
class Identity:
    """What produced the replies; stamped on every record."""

    backend: str
    model: str
    adapter: str | None = None
    version: int | None = None
    context: str = "full"
    """What each turn was answered from (``maze_policy.contexts.CONTEXTS``); records name it in
    ``extra`` when it is not ``full``."""


def replay_path(
    maze: Maze, replies: Sequence[str], step_budget: int, max_chars: int = MAX_ACTION_CHARS
) -> list[tuple[int, int]]:
    """The squares the agent visited, replaying the replies under the episode rules."""
    game = MazeGame.start(maze, step_budget=step_budget)
    for reply in replies:
        if game.done:
            break
        game.step(parse_action(reply, max_chars=max_chars))
    return list(game.trajectory)


def count_loops(path: Sequence[tuple[int, int]]) -> int:
    """How many steps of ``path`` land on a square already visited."""
    seen: set[tuple[int, int]] = set()
    loops = 0
    for pos in path:
        loops += pos in seen
        seen.add(pos)
    return loops


def make_record(
    *,
    eval_set: str,
    row: Mapping[str, Any],
    sample: int,
    replies: Sequence[str],
    reward: float,
    identity: Identity,
    elapsed_s: float,
    extra: Mapping[str, Any] | None = None,
) -> EvalRecord:
    """Build a record from a finished episode's replies and the env's reward."""
    preset = str(row["preset"])
    seed = int(row["seed"])
    budget = int(row["step_budget"])
    maze = generate(preset, seed)
    score = score_episode(maze, list(replies), step_budget=budget)
    path = replay_path(maze, replies, budget)
    failure: FailureKind
    if score.solved:
        failure = "solved"
    elif score.terminated:
        failure = "wrong_stop"
    elif score.truncated:
        failure = "out_of_budget"
    else:
        failure = "unfinished"
    return EvalRecord(
        eval_set=eval_set,
        preset=preset,
        seed=seed,
        sample=sample,
        solved=score.solved,
        reward=float(reward),
        turns=score.turns,
        moves=score.moves,
        optimal_moves=score.optimal_moves,
        step_budget=budget,
        failure=failure,
        bumps=score.bumps,
        loops=count_loops(path),
        parse_failures=score.invalid,
        parse_failure_codes=list(score.parse_failures),
        path=[[r, c] for r, c in path],
        replies=[r[:REPLY_CHARS] for r in replies],
        backend=identity.backend,
        model=identity.model,
        adapter=identity.adapter,
        version=identity.version,
        elapsed_s=round(elapsed_s, 4),
        extra={
            **({} if identity.context == "full" else {"context": identity.context}),
            **(extra or {}),
        },
    )
