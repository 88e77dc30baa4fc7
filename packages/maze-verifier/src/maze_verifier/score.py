"""Per-episode scoring: replay model turns with :class:`maze_env.MazeGame` and apply a reward spec.

This is the reference path (one Python object per turn); :mod:`maze_verifier.batch` is the fast
one and is tested to agree with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, cast

from maze_env import (
    DEFAULT_SLACK,
    MAX_ACTION_CHARS,
    Action,
    Maze,
    MazeGame,
    ParseFailure,
    parse_action,
)
from maze_verifier.path import MAX_PATH_CHARS, MAX_PATH_MOVES, PathFailure, parse_path
from maze_verifier.specs import RewardSpec, get_spec
from maze_verifier.tags import has_all_tags

MAX_REASONS = 8
"""Per-turn notes kept in an :class:`EpisodeScore`; later ones are summarised in a count."""


@dataclass(frozen=True, slots=True)
class EpisodeScore:
    """How an episode went and what it earned under ``spec``."""

    reward: float
    solved: bool
    terminated: bool
    """The model said ``stop`` (on the goal or not)."""
    truncated: bool
    """The step budget ran out before ``stop``."""
    turns: int
    """Turns played, each using one step of the budget; turns after the end are not counted."""
    moves: int
    """Moves that changed the agent's square."""
    bumps: int
    invalid: int
    optimal_moves: int
    step_budget: int
    tag_fraction: float
    efficiency: float
    final_pos: tuple[int, int]
    spec: str
    parse_failures: tuple[str, ...] = ()
    """Failure codes of the unusable turns, in order."""
    reasons: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["final_pos"] = list(self.final_pos)
        out["parse_failures"] = list(self.parse_failures)
        out["reasons"] = list(self.reasons)
        return out


def efficiency_credit(solved: bool, optimal_moves: int, spent: int) -> float:
    """``optimal / spent`` turns before stop when solved, else 0 (1 for a zero-move maze)."""
    if not solved:
        return 0.0
    return 1.0 if optimal_moves <= 0 else optimal_moves / max(spent, optimal_moves)


def _step(game: MazeGame, parsed: Action | ParseFailure) -> None:
    # MazeGame.step applies a ParseFailure as an invalid turn (its own parse result type), so the
    # episode rules stay in maze-env while the verifier keeps its own length cap.
    game.step(cast(Action, parsed))


def _finish(
    game: MazeGame,
    *,
    spec: RewardSpec,
    tag_frac: float,
    failures: list[str],
    notes: list[str],
    extra_notes: Iterable[str] = (),
) -> EpisodeScore:
    maze = game.maze
    solved = game.solved
    spent = game.steps_used - (1 if game.terminated else 0)
    eff = efficiency_credit(solved, maze.optimal_moves, spent)
    moves = len(game.trajectory) - 1
    invalid = len(failures)
    bumps = spent - moves - invalid
    reasons: list[str] = []
    if solved:
        reasons.append(
            f"solved: stopped on the goal after {game.steps_used} turns ({maze.optimal_moves} optimal moves)"
        )
    elif game.terminated:
        reasons.append(f"stopped at {game.agent}, not on the goal {maze.goal}")
    elif game.truncated:
        reasons.append(f"step budget of {game.step_budget} turns exhausted without stop")
    else:
        reasons.append(f"unfinished: no stop after {game.steps_used} of {game.step_budget} turns")
    reasons.extend(notes[:MAX_REASONS])
    if len(notes) > MAX_REASONS:
        reasons.append(f"... {len(notes) - MAX_REASONS} more notes")
    reasons.extend(extra_notes)
    return EpisodeScore(
        reward=spec.reward(solved=solved, tag_fraction=tag_frac, efficiency=eff),
        solved=solved,
        terminated=game.terminated,
        truncated=game.truncated,
        turns=game.steps_used,
        moves=moves,
        bumps=bumps,
        invalid=invalid,
        optimal_moves=maze.optimal_moves,
        step_budget=game.step_budget,
        tag_fraction=tag_frac,
        efficiency=eff,
        final_pos=game.agent,
        spec=spec.name,
        parse_failures=tuple(failures),
        reasons=tuple(reasons),
    )


def score_episode(
    maze: Maze,
    turns: Sequence[object],
    spec: str | RewardSpec | Mapping[str, Any] = "task",
    *,
    step_budget: int | None = None,
    slack: int = DEFAULT_SLACK,
    max_chars: int = MAX_ACTION_CHARS,
) -> EpisodeScore:
    """Replay one multi-turn episode (one model reply per turn) and score it.

    Never raises on the content of ``turns``: any reply that is not text, too long, or holds no
    action is an invalid turn with its reason recorded. Turns after the episode ended are ignored.
    """
    if isinstance(turns, str | bytes):
        raise TypeError("turns must be a sequence of replies, one per turn, not a single string")
    rs = get_spec(spec)
    game = MazeGame.start(maze, step_budget=step_budget, slack=slack)
    failures: list[str] = []
    notes: list[str] = []
    tagged = played = 0
    for i, turn in enumerate(turns):
        if game.done:
            notes.append(f"{len(turns) - i} turns after the episode ended were ignored")
            break
        parsed = parse_action(turn, max_chars=max_chars)
        if isinstance(parsed, ParseFailure):
            failures.append(parsed.code)
            notes.append(f"turn {i + 1}: {parsed.reason}")
        _step(game, parsed)
        played += 1
        # A refused (over-long) reply earns no format credit and is not scanned.
        if not (isinstance(parsed, ParseFailure) and parsed.code == "too_long"):
            tagged += has_all_tags(turn, rs.format_tags)
    return _finish(
        game, spec=rs, tag_frac=tagged / played if played else 0.0, failures=failures, notes=notes
    )


def score_path(
    maze: Maze,
    text: object,
    spec: str | RewardSpec | Mapping[str, Any] = "task",
    *,
    step_budget: int | None = None,
    slack: int = DEFAULT_SLACK,
    max_chars: int = MAX_PATH_CHARS,
    max_moves: int = MAX_PATH_MOVES,
    implicit_stop: bool = True,
) -> EpisodeScore:
    """Score a single-turn whole-path answer by replaying it with :class:`MazeGame` rules.

    Each move uses one step of the budget (default: the maze's ``step_budget(slack)``, so the
    optimal path plus stop always fits). If the path does not end in ``stop`` and
    ``implicit_stop`` is set, a stop is applied after the last move, as AlphaMaze judges the final
    square. The format term is 1 if the reply holds every ``spec.format_tags`` tag, else 0.
    """
    rs = get_spec(spec)
    game = MazeGame.start(maze, step_budget=step_budget, slack=slack)
    parsed = parse_path(text, max_chars=max_chars, max_moves=max_moves)
    if isinstance(parsed, PathFailure):
        tag = float(parsed.code != "too_long" and has_all_tags(text, rs.format_tags))
        return _finish(
            game, spec=rs, tag_frac=tag, failures=[parsed.code], notes=[f"answer: {parsed.reason}"]
        )
    notes = list(parsed.notes)
    for i, action in enumerate(parsed.actions):
        if game.done:
            notes.append(f"{len(parsed.actions) - i} moves past the step budget were ignored")
            break
        game.step(action)
    if not game.done and implicit_stop:
        game.step(Action.stop())
        notes.append("no stop in the answer: stopped after the last move")
    tag = float(has_all_tags(text, rs.format_tags))
    return _finish(
        game,
        spec=rs,
        tag_frac=tag,
        failures=[],
        notes=notes,
        extra_notes=(f"path parsed from {parsed.source}",),
    )
