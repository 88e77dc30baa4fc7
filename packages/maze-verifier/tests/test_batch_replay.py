"""The vectorised replay must equal MazeGame (through score_episode) episode for episode."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maze_env import Direction, Maze, MazeGame, generate, parse_action
from maze_verifier import (
    INVALID,
    STOP,
    BatchError,
    MazeBatch,
    action_code,
    encode_turns,
    score_episode,
    verify_batch,
    verify_texts,
)

SPECS = ("task", "visgym_sft", "efficiency", "visgym_sft_efficiency")
MAZE_SPECS = ("easy", "hard", "7x9:dfs", "13x13:prim", "5x5:kruskal")
TAGS = "<observation>o</observation><justification>j</justification>"


@cache
def _maze(spec: str, seed: int) -> Maze:
    return generate(spec, seed)


def _text(code: int, tagged: bool) -> str:
    if 0 <= code <= 3:
        body = f"<action>{Direction(code).word}</action>"
    elif code == STOP:
        body = "<action>stop</action>"
    else:
        body = "<action>sideways</action>"
    return TAGS + body if tagged else body


def _tagged_action(word: str) -> str:
    return TAGS + f"<action>{word}</action>"


def _assert_same(batch_row: dict[str, Any], ref: Any) -> None:
    for key in (
        "solved",
        "terminated",
        "truncated",
        "turns",
        "moves",
        "bumps",
        "invalid",
        "final_pos",
    ):
        assert batch_row[key] == getattr(ref, key), key
    for key in ("reward", "tag_fraction", "efficiency"):
        assert batch_row[key] == pytest.approx(getattr(ref, key)), key


Episode = tuple[str, int, list[int], int, int | None, list[bool]]
episode = st.tuples(
    st.sampled_from(MAZE_SPECS),
    st.integers(0, 40),
    st.lists(st.one_of(st.integers(0, 4), st.integers(-128, 127)), max_size=40),
    st.integers(0, 40),  # extra padding columns of junk beyond the row's length
    st.one_of(st.none(), st.integers(1, 45)),
    st.lists(st.booleans(), min_size=40, max_size=40),
)


@settings(max_examples=150, deadline=None)
@given(episodes=st.lists(episode, min_size=1, max_size=6), spec=st.sampled_from(SPECS))
def test_vectorised_replay_equals_mazegame(episodes: list[Episode], spec: str) -> None:
    mazes = [_maze(s, seed) for s, seed, *_ in episodes]
    t_max = max(len(acts) + pad for _, _, acts, pad, _, _ in episodes) or 1
    codes = np.full((len(episodes), t_max), 99, dtype=np.int8)  # junk past each row's length
    lengths = np.array([len(acts) for _, _, acts, *_ in episodes])
    budgets = np.array(
        [
            b if b is not None else m.step_budget()
            for (*_, b, _), m in zip(episodes, mazes, strict=True)
        ]
    )
    tags = np.zeros((len(episodes), t_max), dtype=np.bool_)
    for i, (_, _, acts, _, _, tagged) in enumerate(episodes):
        codes[i, : len(acts)] = acts
        tags[i, : len(acts)] = tagged[: len(acts)]
    result = verify_batch(mazes, codes, lengths=lengths, step_budget=budgets, spec=spec, tags=tags)
    for i, ((_, _, acts, _, _, tagged), maze) in enumerate(zip(episodes, mazes, strict=True)):
        texts = [_text(c, tg) for c, tg in zip(acts, tagged, strict=False)]
        ref = score_episode(maze, texts, spec, step_budget=int(budgets[i]))
        _assert_same(result.episode(i), ref)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 30),
    replies=st.lists(
        st.one_of(
            st.text(max_size=60),
            st.sampled_from(
                ["<action>up</action>", "('move', 3)", "stop", "left", "<action>stop</action>"]
            ),
            st.sampled_from(["up", "down", "left", "right"]).map(_tagged_action),
        ),
        max_size=25,
    ),
    spec=st.sampled_from(SPECS),
)
def test_text_batch_equals_score_episode(seed: int, replies: list[str], spec: str) -> None:
    maze = _maze("easy", seed)
    result = verify_texts([maze], [replies], spec=spec)
    _assert_same(result.episode(0), score_episode(maze, replies, spec))


def test_shared_mazes_via_maze_index_and_mixed_sizes() -> None:
    mazes = [generate("easy", 1), generate("15x21:dfs", 2)]
    optimal = [[int(d) for d in m.optimal_actions] + [STOP] for m in mazes]
    t = max(len(o) for o in optimal)
    codes = np.full((4, t), INVALID, dtype=np.int8)
    idx = [0, 1, 1, 0]
    for row, m in enumerate(idx):
        codes[row, : len(optimal[m])] = optimal[m]
    codes[3, 0] = STOP  # stops at the start: terminated, not solved
    lengths = np.array([len(optimal[m]) for m in idx])
    res = verify_batch(MazeBatch.from_mazes(mazes), codes, maze_index=idx, lengths=lengths)
    assert res.solved.tolist() == [True, True, True, False]
    assert res.terminated.all()
    assert res.turns.tolist() == [len(optimal[0]), len(optimal[1]), len(optimal[1]), 1]
    assert res.final_pos[1].tolist() == list(mazes[1].goal)
    assert res.summary()["solve_rate"] == 0.75


@pytest.mark.parametrize("dtype", [np.int16, np.int64, np.uint8, np.uint64])
def test_wide_int_codes_do_not_wrap_into_moves(dtype: type[np.integer[Any]]) -> None:
    maze = generate("easy", 3)
    # 256 wraps to 0 (right) and 260 to 4 (stop) if narrowed carelessly; 255 is -1 as int8.
    raw = [256, 260, 255] if np.iinfo(dtype).max > 255 else [255, 5, 200]
    res = verify_batch([maze], np.array([raw], dtype=dtype))
    assert res.invalid.tolist() == [3]
    assert res.moves.tolist() == [0]
    assert not res.terminated[0]


def test_action_codes_match_parse_results() -> None:
    assert action_code(parse_action("<action>down</action>")) == 3
    assert action_code(parse_action("('stop', 'stop')")) == STOP
    assert action_code(parse_action("nonsense")) == INVALID
    codes, lengths, tags = encode_turns([["up", "stop"], []], format_tags=("action",))
    assert codes.tolist() == [[1, 4], [INVALID, INVALID]]
    assert lengths.tolist() == [2, 0]
    assert tags is not None
    assert not tags.any()


def test_empty_episode_rows_score_zero() -> None:
    maze = generate("easy", 4)
    res = verify_batch([maze], np.zeros((1, 0), dtype=np.int8), spec="visgym_sft")
    assert res.turns.tolist() == [0]
    assert res.reward.tolist() == [0.0]
    ref = score_episode(maze, [], "visgym_sft")
    assert ref.turns == 0
    assert ref.reward == 0.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"actions": np.zeros((2, 3), dtype=np.int8)}, "pass maze_index"),
        ({"actions": np.zeros(3, dtype=np.int8)}, r"\(E, T\)"),
        ({"actions": np.zeros((1, 3), dtype=np.float32)}, "integer"),
        ({"actions": np.zeros((1, 3), dtype=np.int8), "maze_index": [5]}, "maze_index"),
        ({"actions": np.zeros((1, 3), dtype=np.int8), "lengths": [4]}, "lengths"),
        ({"actions": np.zeros((1, 3), dtype=np.int8), "step_budget": 0}, "step_budget"),
        (
            {"actions": np.zeros((1, 3), dtype=np.int8), "tags": np.zeros((1, 2), dtype=bool)},
            "tags",
        ),
    ],
)
def test_batch_rejects_mismatched_arrays(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(BatchError, match=match):
        verify_batch([generate("easy", 1)], **kwargs)


def test_maze_batch_validates_grids() -> None:
    open_grid = np.zeros((1, 5, 5), dtype=np.bool_)
    pts = np.array([[1, 1]])
    with pytest.raises(BatchError, match="outer wall"):
        MazeBatch(open_grid, pts, pts, np.array([0]))
    walled = np.ones((1, 5, 5), dtype=np.bool_)
    with pytest.raises(BatchError, match="open squares"):
        MazeBatch(walled, pts, pts, np.array([0]))
    with pytest.raises(BatchError, match="at least one maze"):
        MazeBatch.from_mazes([])


def test_mazegame_reference_agrees_on_a_hand_checked_episode() -> None:
    # Pin one episode by hand so the property tests are not comparing two wrong replays.
    maze = generate("easy", 7)
    game = MazeGame.start(maze)
    wrong = next(
        d
        for d in Direction
        if not maze.is_open(
            (maze.start[0] + (d == 3) - (d == 1), maze.start[1] + (d == 0) - (d == 2))
        )
    )
    texts = (
        [f"<action>{wrong.word}</action>", "garbage"]
        + [d.word for d in maze.optimal_actions]
        + ["stop"]
    )
    for t in texts:
        game.step(t)
    res = verify_texts([maze], [texts], spec="efficiency")
    row = res.episode(0)
    assert game.solved
    assert row["solved"]
    assert row["bumps"] == 1
    assert row["invalid"] == 1
    assert row["moves"] == maze.optimal_moves
    assert row["efficiency"] == pytest.approx(maze.optimal_moves / (maze.optimal_moves + 2))
    assert row["reward"] == pytest.approx(0.8 + 0.2 * maze.optimal_moves / (maze.optimal_moves + 2))
