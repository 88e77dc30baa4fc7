"""Vectorised verification of many episodes at once, with :class:`maze_env.MazeGame` semantics.

Episodes are rows of an ``(E, T)`` int8 array of action codes: ``0-3`` move (VisGym's right, up,
left, down), ``4`` stop, anything else (``-1`` by convention) an invalid turn that still uses one
step of the budget. ``lengths`` says how many turns each row really has; cells past it are padding
and cost nothing.

The rules are resolved with whole-array operations before the replay loop, so the loop over turns
only moves agents:

* a turn is played if it comes before the row's length, the step budget, and the first stop;
* the episode terminates at its first played stop and is solved if the agent is then on the goal;
* it is truncated if it played ``step_budget`` turns without a stop;
* a move into a wall (or the maze's edge) is a bump and leaves the agent in place.

Agents are flat indices into the stacked wall grids, so a move is one add and one gather per
turn across all episodes. Tests check it equals :class:`MazeGame` on random mazes and actions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from maze_env import DEFAULT_SLACK, MAX_ACTION_CHARS, Action, Maze, parse_action
from maze_verifier.errors import MazeVerifierError
from maze_verifier.specs import RewardSpec, get_spec
from maze_verifier.tags import has_all_tags

MOVE_CODES = (0, 1, 2, 3)
STOP = 4
INVALID = -1

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]

_KIND_INVALID, _KIND_MOVE, _KIND_STOP, _KIND_PAD = 0, 1, 2, 3


class BatchError(MazeVerifierError, ValueError):
    """Arrays handed to the batch verifier that do not fit together."""


@dataclass(frozen=True, eq=False)
class MazeBatch:
    """``M`` mazes stacked into one ``(M, H, W)`` wall array, smaller ones padded with wall.

    ``start`` and ``goal`` are ``(M, 2)`` (row, col); ``optimal_moves`` is ``(M,)``.
    """

    walls: BoolArray
    start: IntArray
    goal: IntArray
    optimal_moves: IntArray

    def __post_init__(self) -> None:
        w = self.walls
        if w.ndim != 3 or w.dtype != np.bool_ or w.shape[0] == 0:
            raise BatchError(
                f"walls must be a non-empty (M, H, W) bool array, got {w.dtype} {w.shape}"
            )
        m = w.shape[0]
        for name, arr, shape in (
            ("start", self.start, (m, 2)),
            ("goal", self.goal, (m, 2)),
            ("optimal_moves", self.optimal_moves, (m,)),
        ):
            if arr.shape != shape:
                raise BatchError(f"{name} must have shape {shape}, got {arr.shape}")
        # The replay never bounds-checks a move: a closed border keeps every agent inside its grid.
        if not (w[:, 0, :].all() and w[:, -1, :].all() and w[:, :, 0].all() and w[:, :, -1].all()):
            raise BatchError("every maze needs a closed outer wall (border squares must be walls)")
        for name, pts in (("start", self.start), ("goal", self.goal)):
            r, c = pts[:, 0], pts[:, 1]
            if (r < 0).any() or (r >= w.shape[1]).any() or (c < 0).any() or (c >= w.shape[2]).any():
                raise BatchError(f"{name} positions must lie inside the grid")
            if w[np.arange(m), r, c].any():
                raise BatchError(f"{name} positions must be open squares")

    @classmethod
    def from_mazes(cls, mazes: Sequence[Maze]) -> MazeBatch:
        if not mazes:
            raise BatchError("need at least one maze")
        h = max(m.shape[0] for m in mazes)
        w = max(m.shape[1] for m in mazes)
        walls = np.ones((len(mazes), h, w), dtype=np.bool_)
        for i, m in enumerate(mazes):
            walls[i, : m.shape[0], : m.shape[1]] = m.walls
        return cls(
            walls=walls,
            start=np.array([m.start for m in mazes], dtype=np.int64),
            goal=np.array([m.goal for m in mazes], dtype=np.int64),
            optimal_moves=np.array([m.optimal_moves for m in mazes], dtype=np.int64),
        )

    @property
    def size(self) -> int:
        return int(self.walls.shape[0])


@dataclass(frozen=True, eq=False)
class BatchResult:
    """Per-episode outcomes, each an ``(E,)`` array (``final_pos`` is ``(E, 2)``)."""

    reward: FloatArray
    solved: BoolArray
    terminated: BoolArray
    truncated: BoolArray
    turns: IntArray
    moves: IntArray
    bumps: IntArray
    invalid: IntArray
    optimal_moves: IntArray
    step_budget: IntArray
    tag_fraction: FloatArray
    efficiency: FloatArray
    final_pos: IntArray
    spec: str

    def __len__(self) -> int:
        return int(self.reward.shape[0])

    def episode(self, i: int) -> dict[str, Any]:
        """One episode's outcome as plain Python values."""
        return {
            "reward": float(self.reward[i]),
            "solved": bool(self.solved[i]),
            "terminated": bool(self.terminated[i]),
            "truncated": bool(self.truncated[i]),
            "turns": int(self.turns[i]),
            "moves": int(self.moves[i]),
            "bumps": int(self.bumps[i]),
            "invalid": int(self.invalid[i]),
            "optimal_moves": int(self.optimal_moves[i]),
            "step_budget": int(self.step_budget[i]),
            "tag_fraction": float(self.tag_fraction[i]),
            "efficiency": float(self.efficiency[i]),
            "final_pos": (int(self.final_pos[i, 0]), int(self.final_pos[i, 1])),
            "spec": self.spec,
        }

    def summary(self) -> dict[str, float]:
        n = max(len(self), 1)
        return {
            "episodes": float(len(self)),
            "mean_reward": float(self.reward.sum() / n),
            "solve_rate": float(self.solved.sum() / n),
            "mean_turns": float(self.turns.sum() / n),
            "mean_invalid": float(self.invalid.sum() / n),
        }


def _per_episode(
    value: int | npt.ArrayLike | None, e: int, name: str, default: IntArray
) -> IntArray:
    if value is None:
        return default
    arr = np.asarray(value)
    if arr.ndim == 0:
        arr = np.full(e, arr)
    if arr.shape != (e,) or not np.issubdtype(arr.dtype, np.integer):
        raise BatchError(
            f"{name} must be an int or an ({e},) int array, got {arr.dtype} {arr.shape}"
        )
    return arr.astype(np.int64, copy=False)


def _kind_tables(width: int) -> tuple[npt.NDArray[np.uint8], IntArray]:
    # Indexed by the code's uint8 bit pattern, so any int8 value maps in one gather.
    kind = np.full(256, _KIND_INVALID, dtype=np.uint8)
    kind[list(MOVE_CODES)] = _KIND_MOVE
    kind[STOP] = _KIND_STOP
    delta = np.zeros(256, dtype=np.int64)
    delta[list(MOVE_CODES)] = (1, -width, -1, width)  # right, up, left, down on a flat grid
    return kind, delta


@dataclass(frozen=True, eq=False)
class _Turns:
    """Which turns each episode plays, resolved with whole-array operations before the replay."""

    kind: npt.NDArray[np.uint8]
    """``(E, T)``: invalid, move or stop for played turns, pad for the rest."""
    delta: IntArray
    """``(E, T)``: each played move's offset on the flat grid, 0 for every other cell."""
    steps: IntArray
    terminated: BoolArray
    truncated: BoolArray


def _action_codes(actions: npt.ArrayLike) -> npt.NDArray[np.int8]:
    acts = np.asarray(actions)
    if acts.ndim != 2 or not np.issubdtype(acts.dtype, np.integer):
        raise BatchError(f"actions must be an (E, T) integer array, got {acts.dtype} {acts.shape}")
    if acts.dtype != np.int8:
        # Out-of-range codes are invalid turns; clip before narrowing so none wraps into 0-4.
        acts = np.clip(acts, -1, 5).astype(np.int8)
    return acts


def _maze_index(maze_index: npt.ArrayLike | None, e: int, m: int) -> IntArray:
    idx = _per_episode(maze_index, e, "maze_index", np.arange(e, dtype=np.int64))
    if maze_index is None and e != m:
        raise BatchError(f"{e} episodes but {m} mazes: pass maze_index to map episodes to mazes")
    if e and (idx.min() < 0 or idx.max() >= m):
        raise BatchError(f"maze_index values must lie in 0..{m - 1}")
    return idx


def _step_budgets(
    step_budget: int | npt.ArrayLike | None, e: int, optimal: IntArray, slack: int
) -> IntArray:
    if slack < 0:
        raise BatchError(f"slack must be >= 0, got {slack}")
    budget = _per_episode(step_budget, e, "step_budget", optimal + 1 + slack)
    if e and budget.min() < 1:
        raise BatchError("step_budget must be >= 1")
    return budget


def _lengths(lengths: npt.ArrayLike | None, e: int, t_max: int) -> IntArray:
    length = _per_episode(lengths, e, "lengths", np.full(e, t_max, dtype=np.int64))
    if e and (length.min() < 0 or length.max() > t_max):
        raise BatchError(f"lengths must lie in 0..{t_max}")
    return length


def _resolve_turns(
    acts: npt.NDArray[np.int8], length: IntArray, budget: IntArray, width: int
) -> _Turns:
    """Played turns: before the row's end and the budget, up to and including the first stop."""
    e, t_max = acts.shape
    kind_lut, delta_lut = _kind_tables(width)
    codes = acts.view(np.uint8)
    kind: npt.NDArray[np.uint8] = kind_lut[codes]
    limit = np.minimum(length, budget)
    cols: IntArray = np.arange(t_max, dtype=np.int64)
    kind[cols[None, :] >= limit[:, None]] = _KIND_PAD
    is_stop: BoolArray = kind == _KIND_STOP
    terminated: BoolArray = is_stop.any(axis=1)
    # argmax has no answer for zero columns; no column means no stop anyway.
    first_stop: IntArray = (
        np.where(terminated, is_stop.argmax(axis=1), t_max) if t_max else np.zeros(e, np.int64)
    )
    kind[cols[None, :] > first_stop[:, None]] = _KIND_PAD
    steps = np.where(terminated, first_stop + 1, limit)
    return _Turns(
        kind=kind,
        delta=np.where(kind == _KIND_MOVE, delta_lut[codes], 0),
        steps=steps,
        terminated=terminated,
        truncated=~terminated & (steps >= budget),
    )


def _replay(batch: MazeBatch, idx: IntArray, turns: _Turns) -> tuple[IntArray, IntArray]:
    """Move every agent turn by turn.

    Returns:
        Each episode's final position (flat, within its own maze grid) and its wall bumps.
    """
    e = idx.shape[0]
    _, h, w = batch.walls.shape
    flat = batch.walls.reshape(-1)
    base = idx * (h * w)
    pos: IntArray = base + batch.start[idx, 0] * w + batch.start[idx, 1]
    bumps = np.zeros(e, dtype=np.int64)
    # Columns no episode plays need no replay; a zero delta never hits a wall (agents stand on
    # open squares), so padded and non-move cells fall through without masking.
    last = int(turns.steps.max()) if e else 0
    delta_t = np.ascontiguousarray(turns.delta[:, :last].T)
    for t in range(last):
        nxt: IntArray = pos + delta_t[t]
        blocked: BoolArray = flat[nxt]
        pos = np.where(blocked, pos, nxt)
        bumps += blocked
    return pos - base, bumps


def _efficiency(solved: BoolArray, optimal: IntArray, turns: _Turns) -> FloatArray:
    spent = turns.steps - turns.terminated
    return np.where(
        solved, np.where(optimal > 0, optimal / np.maximum(spent, np.maximum(optimal, 1)), 1.0), 0.0
    )


def _tag_fraction(tags: npt.ArrayLike | None, steps: IntArray, t_max: int) -> FloatArray:
    e = steps.shape[0]
    if tags is None:
        return np.zeros(e, dtype=np.float64)
    tag_arr = np.asarray(tags, dtype=np.bool_)
    if tag_arr.shape != (e, t_max):
        raise BatchError(f"tags must have the actions' shape {(e, t_max)}, got {tag_arr.shape}")
    cols: IntArray = np.arange(t_max, dtype=np.int64)
    played: BoolArray = np.logical_and(tag_arr, cols[None, :] < steps[:, None])
    return np.where(steps > 0, played.sum(axis=1) / np.maximum(steps, 1), 0.0)


def verify_batch(
    mazes: MazeBatch | Sequence[Maze],
    actions: npt.ArrayLike,
    *,
    maze_index: npt.ArrayLike | None = None,
    lengths: npt.ArrayLike | None = None,
    step_budget: int | npt.ArrayLike | None = None,
    slack: int = DEFAULT_SLACK,
    spec: str | RewardSpec | Mapping[str, Any] = "task",
    tags: npt.ArrayLike | None = None,
) -> BatchResult:
    """Replay ``E`` episodes of action codes against their mazes and score them under ``spec``.

    ``actions`` is ``(E, T)`` of ints in ``-128..127`` (see the module docstring). ``maze_index``
    maps episode to maze (default: episode ``i`` plays maze ``i``), so GRPO groups can share one
    grid. ``step_budget`` defaults to each maze's ``optimal_moves + 1 + slack``, as
    :meth:`Maze.step_budget`. ``tags`` is an optional ``(E, T)`` bool array: whether each turn
    holds the spec's format tags; the format term averages it over played turns.
    """
    rs = get_spec(spec)
    batch = mazes if isinstance(mazes, MazeBatch) else MazeBatch.from_mazes(mazes)
    acts = _action_codes(actions)
    e, t_max = acts.shape
    w = batch.walls.shape[2]
    idx = _maze_index(maze_index, e, batch.size)
    optimal = batch.optimal_moves[idx]
    budget = _step_budgets(step_budget, e, optimal, slack)
    turns = _resolve_turns(acts, _lengths(lengths, e, t_max), budget, w)
    local, bumps = _replay(batch, idx, turns)
    solved: BoolArray = turns.terminated & (local == batch.goal[idx, 0] * w + batch.goal[idx, 1])
    efficiency = _efficiency(solved, optimal, turns)
    tag_frac = _tag_fraction(tags, turns.steps, t_max)
    reward: FloatArray = rs.task * solved + rs.format * tag_frac + rs.efficiency * efficiency
    return BatchResult(
        reward=reward.astype(np.float64),
        solved=solved,
        terminated=turns.terminated,
        truncated=turns.truncated,
        turns=turns.steps.astype(np.int64),
        moves=((turns.kind == _KIND_MOVE).sum(axis=1) - bumps).astype(np.int64),
        bumps=bumps,
        invalid=(turns.kind == _KIND_INVALID).sum(axis=1).astype(np.int64),
        optimal_moves=optimal,
        step_budget=budget,
        tag_fraction=tag_frac.astype(np.float64),
        efficiency=efficiency.astype(np.float64),
        final_pos=np.stack([local // w, local % w], axis=1).astype(np.int64),
        spec=rs.name,
    )


def action_code(action: object) -> int:
    """The batch code of a parsed action or parse failure: 0-3 move, 4 stop, -1 invalid."""
    if isinstance(action, Action):
        if action.kind == "stop":
            return STOP
        return int(action.direction) if action.direction is not None else INVALID
    return INVALID


def encode_turns(
    episodes: Sequence[Sequence[object]],
    *,
    format_tags: Sequence[str] | None = None,
    max_turns: int | None = None,
    max_chars: int = MAX_ACTION_CHARS,
) -> tuple[npt.NDArray[np.int8], IntArray, BoolArray | None]:
    """Parse replies into ``(codes, lengths, tags)`` for :func:`verify_batch`.

    Each reply goes through :func:`maze_env.parse_action` (never raises). ``max_turns`` caps the
    columns (default: the longest episode); later turns are dropped, which is safe when it is at
    least the step budget. ``tags`` is None unless ``format_tags`` is given.
    """
    e = len(episodes)
    t_max = max((len(ep) for ep in episodes), default=0) if max_turns is None else max_turns
    codes = np.full((e, t_max), INVALID, dtype=np.int8)
    lengths = np.zeros(e, dtype=np.int64)
    tag_arr = None if format_tags is None else np.zeros((e, t_max), dtype=np.bool_)
    for i, ep in enumerate(episodes):
        if isinstance(ep, str | bytes):
            raise BatchError(f"episode {i} must be a sequence of replies, not a single string")
        n = min(len(ep), t_max)
        lengths[i] = n
        row = codes[i]
        for j in range(n):
            reply = ep[j]
            row[j] = action_code(parse_action(reply, max_chars=max_chars))
            if tag_arr is not None and isinstance(reply, str) and len(reply) <= max_chars:
                tag_arr[i, j] = has_all_tags(reply, format_tags or ())
    return codes, lengths, tag_arr


def verify_texts(
    mazes: MazeBatch | Sequence[Maze],
    episodes: Sequence[Sequence[object]],
    *,
    maze_index: npt.ArrayLike | None = None,
    step_budget: int | npt.ArrayLike | None = None,
    slack: int = DEFAULT_SLACK,
    spec: str | RewardSpec | Mapping[str, Any] = "task",
    max_chars: int = MAX_ACTION_CHARS,
) -> BatchResult:
    """Parse every reply, then replay with :func:`verify_batch`. Agrees with :func:`score_episode`."""
    rs = get_spec(spec)
    codes, lengths, tag_arr = encode_turns(
        episodes, format_tags=rs.format_tags, max_chars=max_chars
    )
    return verify_batch(
        mazes,
        codes,
        maze_index=maze_index,
        lengths=lengths,
        step_budget=step_budget,
        slack=slack,
        spec=rs,
        tags=tag_arr,
    )
