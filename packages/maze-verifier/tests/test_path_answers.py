"""Single-turn whole-path answers: parsing every accepted form, and replay by MazeGame rules."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maze_env import Action, Direction, Maze, MazeGame, generate
from maze_env.actions import DIRECTION_DELTAS
from maze_verifier import PathAnswer, PathFailure, parse_path, score_path

R, U, L, D = (Action.move(d) for d in Direction)
STOP = Action.stop()


def _moves(result: object) -> tuple[Action, ...]:
    assert isinstance(result, PathAnswer), result
    return result.actions


@pytest.mark.parametrize(
    ("text", "expected", "source"),
    [
        ("<answer>right, right, down</answer>", (R, R, D), "tokens"),
        ("Thinking... <answer>RRDD</answer>", (R, R, D, D), "tokens"),
        ("R R D D", (R, R, D, D), "tokens"),
        ("move up then left, stop", (U, L, STOP), "tokens"),
        ("→ → ↓ ←", (R, R, D, L), "tokens"),
        ('["right", "down", "stop"]', (R, D, STOP), "json"),
        ("[0, 3, 1]", (R, D, U), "json"),
        ('[["move", 0], ["move", "down"], ["stop", "stop"]]', (R, D, STOP), "json"),
        ("('move', 0), ('move', 3) ('stop', 'stop')", (R, D, STOP), "tuples"),
        ("<|right|><|down|><|0-1|><|left|>", (R, D, L), "alphamaze"),
        ("<think>go <|up|></think><answer><|right|><|right|></answer>", (R, R), "alphamaze"),
        ("<answer>Right,\n Up.</answer>", (R, U), "tokens"),
    ],
)
def test_accepted_forms(text: str, expected: tuple[Action, ...], source: str) -> None:
    result = parse_path(text)
    assert _moves(result) == expected
    assert isinstance(result, PathAnswer)
    assert result.source == source


@pytest.mark.parametrize(
    ("text", "code"),
    [
        (None, "not_text"),
        ("", "empty"),
        ("<answer> </answer>", "empty"),
        ("The path is right then down", "bad_token"),
        ("<answer>[1, 2, 9]</answer>", "bad_token"),
        ("[1, 2", "bad_token"),
        ("[" * 5000 + "]" * 5000, "bad_token"),
        ("('move', 7) ('move', 1)", "bad_token"),
        ("<answer>move move</answer>", "no_path"),
        ("<|wall|><|0-0|>", "bad_token"),
        ("R" * 5000, "too_many_moves"),
        ("x" * 70_000, "too_long"),
    ],
)
def test_refusals_are_typed(text: object, code: str) -> None:
    result = parse_path(text)
    assert isinstance(result, PathFailure), result
    assert result.code == code
    assert result.reason


def test_actions_after_stop_are_dropped_with_a_note() -> None:
    result = parse_path("up, stop, left, left")
    assert _moves(result) == (U, STOP)
    assert isinstance(result, PathAnswer)
    assert result.notes == ("2 actions after stop were ignored",)


def test_caps_are_configurable() -> None:
    assert isinstance(parse_path("RRRR", max_moves=3), PathFailure)
    assert _moves(parse_path("RRR", max_moves=3)) == (R, R, R)
    assert isinstance(parse_path("RRRR", max_chars=3), PathFailure)


def _letters(maze: Maze) -> str:
    return "".join(d.word[0].upper() for d in maze.optimal_actions)


def test_optimal_path_solves_with_implicit_stop() -> None:
    maze = generate("hard", 4)
    s = score_path(maze, f"<answer>{_letters(maze)}</answer>", "efficiency")
    assert s.solved
    assert s.reward == pytest.approx(1.0)
    assert s.turns == maze.optimal_moves + 1
    assert any("implicit" in r or "stopped after the last move" in r for r in s.reasons)
    strict = score_path(maze, _letters(maze), "task", implicit_stop=False)
    assert not strict.terminated
    assert strict.reward == 0.0


def test_path_through_a_wall_is_replayed_as_bumps() -> None:
    maze = generate("easy", 5)
    path = [d.word for d in maze.optimal_actions]
    r, c = maze.start
    wrong = next(
        d for d, (dr, dc) in DIRECTION_DELTAS.items() if not maze.is_open((r + dr, c + dc))
    )
    s = score_path(maze, json.dumps([wrong.word, *path, "stop"]), "efficiency")
    game = MazeGame.start(maze)
    for a in [wrong.word, *path, "stop"]:
        game.step(a)
    assert s.solved == game.solved
    assert s.final_pos == game.agent
    assert s.turns == game.steps_used
    assert s.bumps == 1


def test_format_tags_for_single_turn_spec() -> None:
    maze = generate("easy", 6)
    spec = {"task": 0.9, "format": 0.1, "format_tags": ["think", "answer"]}
    good = score_path(maze, f"<think>plan</think><answer>{_letters(maze)}</answer>", spec)
    assert good.reward == pytest.approx(1.0)
    bare = score_path(maze, _letters(maze), spec)
    assert bare.reward == pytest.approx(0.9)
    failed = score_path(maze, "<think>plan</think><answer>fly</answer>", spec)
    assert failed.parse_failures == ("bad_token",)
    assert failed.reward == pytest.approx(0.1)


def test_overlong_path_is_truncated_by_the_budget() -> None:
    maze = generate("easy", 7)
    s = score_path(maze, "<answer>" + "LR" * 40 + "</answer>", "task")
    assert s.truncated
    assert s.turns == maze.step_budget()
    assert any("past the step budget" in r for r in s.reasons)


@settings(max_examples=100, deadline=None)
@given(
    moves=st.lists(st.sampled_from(list(Direction)), min_size=1, max_size=60),
    style=st.integers(0, 4),
)
def test_every_written_form_round_trips(moves: list[Direction], style: int) -> None:
    writers = [
        lambda: ", ".join(d.word for d in moves),
        lambda: "".join(d.word[0].upper() for d in moves),
        lambda: json.dumps([int(d) for d in moves]),
        lambda: " ".join(f"('move', {int(d)})" for d in moves),
        lambda: "".join(f"<|{d.word}|>" for d in moves),
    ]
    text = f"<answer>{writers[style]()}</answer>"
    assert _moves(parse_path(text)) == tuple(Action.move(d) for d in moves)
