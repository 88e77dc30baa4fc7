"""score_episode, reward specs and tag detection on hand-built episodes."""

from __future__ import annotations

import math

import pytest

from maze_env import Direction, Maze, generate
from maze_env.actions import DIRECTION_DELTAS
from maze_verifier import (
    SPECS,
    RewardSpec,
    RewardSpecError,
    get_spec,
    has_all_tags,
    has_nonempty_tag,
    register_spec,
    score_episode,
    tag_contents,
    tag_fraction,
)

SFT = "<observation>o</observation>\n<justification>j</justification>\n<action>{}</action>"


def _optimal(maze: Maze, fmt: str = "<action>{}</action>") -> list[str]:
    return [fmt.format(d.word) for d in maze.optimal_actions] + [fmt.format("stop")]


def _wall(maze: Maze) -> Direction:
    r, c = maze.start
    return next(d for d, (dr, dc) in DIRECTION_DELTAS.items() if not maze.is_open((r + dr, c + dc)))


def test_optimal_episode_scores_one_under_every_spec_that_ignores_format() -> None:
    maze = generate("hard", 3)
    for spec in ("task", "efficiency"):
        s = score_episode(maze, _optimal(maze), spec)
        assert s.solved
        assert s.terminated
        assert not s.truncated
        assert s.reward == pytest.approx(1.0)
        assert s.moves == s.optimal_moves == maze.optimal_moves
        assert s.turns == maze.optimal_moves + 1
        assert s.final_pos == maze.goal
        assert s.reasons[0].startswith("solved")


def test_visgym_sft_recipe_weights_task_and_tags() -> None:
    maze = generate("easy", 8)
    tagged = _optimal(maze, SFT)
    assert score_episode(maze, tagged, "visgym_sft").reward == pytest.approx(1.0)
    plain = _optimal(maze)
    assert score_episode(maze, plain, "visgym_sft").reward == pytest.approx(0.8)
    half = [t if i % 2 else p for i, (t, p) in enumerate(zip(tagged, plain, strict=True))]
    s = score_episode(maze, half, "visgym_sft")
    assert s.tag_fraction == pytest.approx((len(half) // 2) / len(half))
    assert s.reward == pytest.approx(0.8 + 0.2 * s.tag_fraction)
    # Format credit without solving: only the 0.2 part.
    unsolved = score_episode(maze, [SFT.format(_wall(maze).word)] * 3, "visgym_sft")
    assert not unsolved.solved
    assert unsolved.reward == pytest.approx(0.2)


def test_wall_bumps_and_invalid_turns_are_counted_and_cost_efficiency() -> None:
    maze = generate("easy", 9)
    turns = [f"<action>{_wall(maze).word}</action>", "hmm, no idea", *_optimal(maze)]
    s = score_episode(maze, turns, "efficiency")
    assert s.solved
    assert s.bumps == 1
    assert s.invalid == 1
    assert s.parse_failures == ("no_action",)
    assert s.efficiency == pytest.approx(maze.optimal_moves / (maze.optimal_moves + 2))
    assert s.reward == pytest.approx(0.8 + 0.2 * s.efficiency)
    assert any("turn 2" in r for r in s.reasons)


def test_budget_truncation_and_ignored_extra_turns() -> None:
    maze = generate("easy", 10)
    bump = f"<action>{_wall(maze).word}</action>"
    s = score_episode(maze, [bump] * 50, "task", step_budget=6)
    assert s.truncated
    assert not s.terminated
    assert s.turns == 6
    assert s.reward == 0.0
    assert any("44 turns after the episode ended were ignored" in r for r in s.reasons)
    assert any("budget" in r for r in s.reasons)


def test_stop_away_from_goal_and_unfinished_episodes() -> None:
    maze = generate("easy", 11)
    stopped = score_episode(maze, ["stop", "up"], "task")
    assert stopped.terminated
    assert not stopped.solved
    assert stopped.turns == 1
    assert "not on the goal" in stopped.reasons[0]
    # Reaching the goal without stop earns nothing: VisGym needs the stop.
    unfinished = score_episode(maze, _optimal(maze)[:-1], "task")
    assert unfinished.final_pos == maze.goal
    assert not unfinished.solved
    assert unfinished.reasons[0].startswith("unfinished")


def test_non_text_and_oversized_turns_are_invalid_with_reasons() -> None:
    maze = generate("easy", 12)
    s = score_episode(
        maze, [None, 42, b"<action>up</action>", "x" * 70_000, *_optimal(maze)], "visgym_sft"
    )
    assert s.parse_failures[0] == "not_text"
    assert s.parse_failures[1] == "not_text"
    assert s.parse_failures[2] == "too_long"  # bytes are decoded and parsed as text
    assert len(s.parse_failures) == 3
    assert any("over the cap" in r for r in s.reasons)
    with pytest.raises(TypeError, match="sequence of replies"):
        score_episode(maze, "<action>up</action>", "task")


def test_reasons_are_bounded() -> None:
    maze = generate("hard", 1)
    s = score_episode(maze, ["?"] * 500, "task")
    assert s.invalid == s.step_budget
    assert len(s.reasons) <= 12
    assert s.to_dict()["parse_failures"] == ["no_action"] * s.step_budget


def test_spec_registry_composition_and_mappings() -> None:
    assert {"task", "visgym_sft", "efficiency"} <= set(SPECS)
    combo = get_spec("task") * 0.5 + get_spec("visgym_sft") * 0.5
    assert (combo.task, combo.format, combo.efficiency) == pytest.approx((0.9, 0.1, 0.0))
    assert combo.max_reward == pytest.approx(1.0)
    custom = get_spec({"base": "visgym_sft", "efficiency": 0.1, "name": "sft_eff"})
    assert (custom.task, custom.format, custom.efficiency) == (0.8, 0.2, 0.1)
    think = get_spec({"task": 1, "format": 0.5, "format_tags": ["think", "answer"]})
    assert think.format_tags == ("think", "answer")
    assert register_spec(custom) is custom
    assert register_spec(custom) is custom  # same weights: a no-op
    with pytest.raises(RewardSpecError, match="already registered"):
        register_spec(RewardSpec("sft_eff", task=0.1))
    del SPECS["sft_eff"]


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("nope", "unknown reward spec"),
        ({"taks": 1}, "unknown reward spec keys"),
        ({"task": "high"}, "bad reward spec mapping"),
        ({"task": math.inf}, "finite"),
        ({"format_tags": "action"}, "list of names"),
        ({"format_tags": ["<action>"]}, "without brackets"),
        ({"format_tags": []}, "non-empty"),
        (3, "must be a name"),
    ],
)
def test_bad_specs_are_refused_with_a_reason(value: object, match: str) -> None:
    with pytest.raises(RewardSpecError, match=match):
        get_spec(value)  # pyright: ignore[reportArgumentType]


def test_tag_detection_pairs_nearest_open_and_ignores_blank_bodies() -> None:
    assert has_nonempty_tag("<Action>up</ACTION>", "action")
    assert not has_nonempty_tag("<action>  \n </action>", "action")
    assert not has_nonempty_tag("<action></action>", "action")
    assert not has_nonempty_tag("<action>up", "action")
    assert not has_nonempty_tag("up</action>", "action")
    assert has_nonempty_tag("</action><action>x</action>", "action")
    assert tag_contents("<a><a>inner</a> <a>two</a>", "a") == ["inner", "two"]
    assert tag_contents("<a>x<b>y</a>z</b>", "b") == ["y</a>z"]  # names pair independently
    assert has_all_tags(SFT.format("up"))
    assert not has_all_tags("<observation>o</observation><action>up</action>")
    assert not has_all_tags(None)
    # Unicode whose lower() grows does not shift the slices.
    assert tag_contents("İİİ<action>up</action>", "action") == ["up"]
    assert tag_fraction([SFT.format("up"), "up", 3]) == pytest.approx(1 / 3)
    assert tag_fraction([]) == 0.0
