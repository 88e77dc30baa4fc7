"""The skyrl-gym environment, driven the way SkyRL's generator drives it."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any, cast

import pyarrow.parquet as pq
import pytest
import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv

from maze_env import Direction, Maze, generate
from maze_env.actions import DIRECTION_DELTAS
from maze_env.export import maze_row, write_rows
from maze_verifier import (
    BatchError,
    EpisodeOverError,
    MazeTextEnvConfigError,
    MazeVerifierError,
    RewardSpecError,
    register_env,
)
from maze_verifier.cli import InputError
from maze_verifier.env import MazeTextEnv

SFT_TURN = "<observation>I am at {pos}</observation><justification>closer</justification><action>{a}</action>"


def _row_extras(maze: Maze) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A dataset row split the way SkyRL splits it: the prompt, and every other column but env_class."""
    row = maze_row(maze, split="train", index=0)
    prompt = row.pop("prompt")
    row.pop("env_class")
    return prompt, row


def _skyrl_make(env_config: Any, extras: dict[str, Any], env_class: str = "maze") -> MazeTextEnv:
    """skyrl_gym.make, exactly as SkyRL's generator calls it."""
    env: object = skyrl_gym.make(env_class, env_config=env_config, extras=extras)  # pyright: ignore[reportUnknownVariableType] - skyrl_gym is untyped
    assert isinstance(env, MazeTextEnv)
    return env


def _make(
    maze: Maze, env_config: dict[str, Any] | None = None
) -> tuple[MazeTextEnv, list[dict[str, Any]]]:
    register_env()
    prompt, extras = _row_extras(maze)
    return _skyrl_make(env_config or {}, extras), prompt


def _wall_direction(maze: Maze) -> Direction:
    r, c = maze.start
    for d, (dr, dc) in DIRECTION_DELTAS.items():
        if not maze.is_open((r + dr, c + dc)):
            return d
    raise AssertionError("start square has no wall next to it")


def _image_bytes(message: dict[str, Any]) -> bytes:
    parts = message["content"]
    url = next(p["image_url"]["url"] for p in parts if p["type"] == "image_url")
    assert url.startswith("data:image/png;base64,")
    return base64.b64decode(url.split(",", 1)[1])


def _text(message: dict[str, Any]) -> str:
    return next(p["text"] for p in message["content"] if p["type"] == "text")


def test_register_is_idempotent_and_make_builds_the_env() -> None:
    assert register_env() == "maze"
    assert register_env() == "maze"
    assert skyrl_gym.registry["maze"].entry_point == "maze_verifier.env:MazeTextEnv"
    env, _ = _make(generate("easy", 5))
    assert isinstance(env, BaseTextEnv)
    assert getattr(env, "spec", None) is not None  # set by skyrl_gym.make
    assert env.max_turns == env.task.step_budget == generate("easy", 5).step_budget()


def test_register_refuses_a_name_taken_by_another_env() -> None:
    # gsm8k ships with skyrl-gym; claiming its name must not silently replace it.
    with pytest.raises(MazeTextEnvConfigError, match="already registered"):
        register_env("gsm8k")


def test_errors_share_one_root_and_keep_their_builtin_bases() -> None:
    # Callers that caught ValueError or RuntimeError before the root existed still catch them.
    for err, builtin in (
        (RewardSpecError, ValueError),
        (BatchError, ValueError),
        (InputError, ValueError),
        (MazeTextEnvConfigError, ValueError),
        (EpisodeOverError, RuntimeError),
    ):
        assert issubclass(err, MazeVerifierError) and issubclass(err, builtin)


def test_optimal_episode_rewards_one_at_the_end() -> None:
    maze = generate("easy", 11)
    env, prompt = _make(maze)
    obs, info = env.init(prompt)
    assert obs == prompt
    assert info["optimal_moves"] == maze.optimal_moves
    assert info["maze_hash"] == maze.content_hash()
    rewards: list[float] = []
    for d in maze.optimal_actions:
        out = env.step(f"<action>{d.word}</action>")
        rewards.append(out["reward"])
        assert not out["done"]
        assert out["metadata"]["outcome"] == "moved"
        (msg,) = out["observations"]
        assert msg["role"] == "user"
        assert _image_bytes(msg).startswith(b"\x89PNG")
        assert "Action executed successfully." in _text(msg)
    out = env.step("('stop', 'stop')")
    assert out["done"]
    assert out["reward"] == 1.0
    assert out["observations"] == []
    assert out["metadata"]["score"]["solved"] is True
    assert rewards == [0.0] * maze.optimal_moves
    metrics = env.get_metrics()
    assert metrics["solved"] is True
    assert metrics["turns"] == maze.optimal_moves + 1
    assert metrics["efficiency"] == 1.0
    agg = MazeTextEnv.aggregate_metrics([metrics, {**metrics, "solved": False}])
    assert agg["solved"] == 0.5
    env.close()


def test_observation_images_follow_the_agent() -> None:
    maze = generate("easy", 12)
    env, prompt = _make(maze, {"cell_px": 8})
    env.init(prompt)
    first = env.step(f"<action>{maze.optimal_actions[0].word}</action>")["observations"][0]
    second = env.step(f"<action>{maze.optimal_actions[1].word}</action>")["observations"][0]
    assert _image_bytes(first) != _image_bytes(second)
    assert "Turns left: " in _text(first)


def test_inline_images_carry_the_same_pixels_as_data_uris() -> None:
    import io

    import numpy as np
    from PIL import Image

    maze = generate("easy", 12)
    words = [d.word for d in maze.optimal_actions[:2]]
    uri_env, prompt = _make(maze, {"cell_px": 8})
    inline_env, _ = _make(maze, {"cell_px": 8, "inline_images": True})
    for env in (uri_env, inline_env):
        env.init(prompt)
    for word in words:
        a = uri_env.step(f"<action>{word}</action>")["observations"][0]
        b = inline_env.step(f"<action>{word}</action>")["observations"][0]
        assert _text(a) == _text(b)
        parts = cast(list[dict[str, Any]], b["content"])
        (part,) = [p for p in parts if p["type"] == "image"]
        assert isinstance(part["image"], Image.Image) and "image_url" not in part
        decoded = np.asarray(Image.open(io.BytesIO(_image_bytes(a))).convert("RGB"))
        assert np.array_equal(np.asarray(part["image"]), decoded)


def test_wall_bump_is_a_no_op_with_feedback() -> None:
    maze = generate("easy", 21)
    env, prompt = _make(maze)
    env.init(prompt)
    out = env.step(f"<action>{_wall_direction(maze).word}</action>")
    assert out["metadata"]["outcome"] == "bumped"
    assert out["metadata"]["agent"] == list(maze.start)
    assert "Cannot move into a wall." in _text(out["observations"][0])
    assert not out["done"]


def test_unparseable_reply_uses_a_turn_and_says_why() -> None:
    maze = generate("easy", 22)
    env, prompt = _make(maze)
    env.init(prompt)
    out = env.step("I think I should go somewhere <action>diagonally</action>")
    assert out["metadata"]["outcome"] == "invalid"
    assert out["metadata"]["parse_failure"] == "invalid_tag"
    assert out["metadata"]["steps_left"] == maze.step_budget() - 1
    assert "Invalid action" in _text(out["observations"][0])


def test_budget_truncation_ends_with_zero_reward() -> None:
    maze = generate("easy", 23)
    env, prompt = _make(maze)
    env.init(prompt)
    bump = f"<action>{_wall_direction(maze).word}</action>"
    outs = [env.step(bump) for _ in range(env.max_turns)]
    assert [o["done"] for o in outs] == [False] * (env.max_turns - 1) + [True]
    assert outs[-1]["reward"] == 0.0
    assert outs[-1]["metadata"]["score"]["truncated"] is True
    assert "Step budget exhausted." in outs[-1]["metadata"]["feedback"]
    with pytest.raises(EpisodeOverError, match="episode is over"):
        env.step(bump)


def test_max_turns_override_truncates_early() -> None:
    maze = generate("easy", 24)
    env, prompt = _make(maze, {"max_turns": 3, "final_observation": True})
    env.init(prompt)
    outs = [env.step(f"<action>{d.word}</action>") for d in maze.optimal_actions[:3]]
    assert [o["done"] for o in outs] == [False, False, True]
    assert outs[-1]["reward"] == 0.0
    assert len(outs[-1]["observations"]) == 1  # final_observation returns the last feedback


def test_visgym_sft_reward_counts_tagged_turns() -> None:
    maze = generate("easy", 31)
    env, prompt = _make(maze, {"reward_spec": "visgym_sft"})
    env.init(prompt)
    actions = [d.word for d in maze.optimal_actions] + ["stop"]
    out: dict[str, Any] = {}
    for i, a in enumerate(actions):
        # Every other turn drops the observation tag.
        text = (
            SFT_TURN.format(pos=i, a=a)
            if i % 2 == 0
            else f"<justification>x</justification><action>{a}</action>"
        )
        out = dict(env.step(text))
    tagged = (len(actions) + 1) // 2
    assert out["done"]
    assert out["reward"] == pytest.approx(0.8 + 0.2 * tagged / len(actions))
    assert out["metadata"]["score"]["tag_fraction"] == pytest.approx(tagged / len(actions))


def test_env_config_mapping_and_row_spec_override() -> None:
    maze = generate("easy", 32)
    register_env()
    prompt, extras = _row_extras(maze)
    extras["reward_spec"]["spec"] = "efficiency"
    env = _skyrl_make({"reward_spec": {"task": 0.5, "format": 0.5}}, extras)
    assert env.reward_spec.name == "efficiency"  # the row wins over env_config
    extras.pop("step_budget")
    extras.pop("env_config")  # exported rows pin slack/cell_px; without them env_config applies
    env2 = _skyrl_make({"slack": 0, "reward_spec": {"task": 0.5, "format": 0.5}}, extras)
    assert env2.max_turns == maze.optimal_moves + 1
    # A detour spends turns: efficiency credit drops below 1 but the maze is still solved.
    env.init(prompt)
    wall = _wall_direction(maze).word
    turns = [f"<action>{wall}</action>"] + [
        f"<action>{d.word}</action>" for d in maze.optimal_actions
    ]
    for t in turns:
        env.step(t)
    out = env.step("<action>stop</action>")
    eff = maze.optimal_moves / (maze.optimal_moves + 1)
    assert out["reward"] == pytest.approx(0.8 + 0.2 * eff)


def test_init_without_prompt_builds_the_standard_one() -> None:
    env, _ = _make(generate("easy", 33))
    obs, _ = env.init([])
    assert [m["role"] for m in obs] == ["system", "user"]
    assert _image_bytes(obs[1]).startswith(b"\x89PNG")


def test_rows_read_back_from_parquet_drive_the_env(tmp_path: Path) -> None:
    mazes = [generate("13x13:dfs", s) for s in (1, 2)]
    path = write_rows(
        [maze_row(m, split="train", index=i) for i, m in enumerate(mazes)], tmp_path / "t.parquet"
    )
    register_env()
    rows = cast(list[dict[str, Any]], pq.read_table(path).to_pylist())
    for maze, row in zip(mazes, rows, strict=True):
        prompt = row.pop("prompt")
        env = _skyrl_make(None, row, row.pop("env_class"))
        assert env.maze.content_hash() == maze.content_hash()
        env.init(prompt)
        for d in maze.optimal_actions:
            env.step(f"('move', {int(d)})")
        assert env.step("<action>stop</action>")["reward"] == 1.0


@pytest.mark.parametrize(
    ("env_config", "extras_patch", "match"),
    [
        ({"colour": 1}, {}, "unknown keys"),
        ({"reward_spec": "nope"}, {}, "unknown reward spec"),
        ({"slack": -1}, {}, "slack"),
        ({"max_turns": 0}, {}, "max_turns"),
        ({"cell_px": "big"}, {}, "cell_px"),
        ({}, {"preset": "nowhere"}, "preset"),
        ({}, {"seed": "x", "extra_info": {}}, "seed"),
        ({}, {"preset": None, "extra_info": {}}, "preset"),
        ({}, {"reward_spec": {"ground_truth": {"optimal_moves": 999}}}, "different generator"),
        ({}, {"step_budget": 0}, "step_budget"),
    ],
)
def test_bad_config_and_rows_fail_with_a_named_key(
    env_config: dict[str, Any], extras_patch: dict[str, Any], match: str
) -> None:
    register_env()
    _, extras = _row_extras(generate("easy", 40))
    extras.update(extras_patch)
    with pytest.raises(MazeTextEnvConfigError, match=match):
        skyrl_gym.make("maze", env_config=env_config, extras=extras)


def test_hostile_replies_never_raise() -> None:
    env, prompt = _make(generate("easy", 41))
    env.init(prompt)
    for reply in ["", "\x00" * 10, "<action>" * 5000, "x" * 200_000, "(('move', 9)", "\ud800"]:
        out = env.step(reply)
        assert out["metadata"]["outcome"] == "invalid"
        assert out["metadata"]["parse_failure"] is not None


def test_row_env_config_overrides_and_generator_max_turns_is_ignored() -> None:
    maze = generate("easy", 42)
    register_env()
    prompt, extras = _row_extras(maze)
    # What SkyRL's generator adds before make(): its own max_turns (default 1).
    extras["max_turns"] = 1
    extras["env_config"] = {"reward_spec": "visgym_sft", "cell_px": 6}
    env = _skyrl_make({"reward_spec": "task", "cell_px": 30}, extras)
    assert env.reward_spec.name == "visgym_sft"
    assert env.config.cell_px == 6
    assert env.max_turns == maze.step_budget()
    env.init(prompt)
    out = env.step(f"<action>{maze.optimal_actions[0].word}</action>")
    assert not out["done"]  # one turn in, despite extras["max_turns"] == 1


def test_path_mode_scores_one_reply_by_replay() -> None:
    maze = generate("hard", 43)
    letters = "".join(d.word[0].upper() for d in maze.optimal_actions)
    env, _ = _make(maze, {"mode": "path", "reward_spec": "efficiency"})
    assert env.max_turns == 1
    obs, info = env.init([])
    assert info["mode"] == "path"
    assert "<answer>" in obs[0]["content"]
    assert _image_bytes(obs[1]).startswith(b"\x89PNG")
    out = env.step(f"<think>down the corridor</think><answer>{letters}</answer>")
    assert out["done"]
    assert out["reward"] == 1.0
    assert out["observations"] == []
    assert out["metadata"]["score"]["solved"] is True
    assert env.get_metrics()["solved"] is True
    with pytest.raises(EpisodeOverError, match="episode is over"):
        env.step("R")
    bad, _ = _make(maze, {"mode": "path"})
    out = bad.step("<answer>teleport</answer>")
    assert out["done"]
    assert out["reward"] == 0.0
    assert out["metadata"]["score"]["parse_failures"] == ["bad_token"]
    with pytest.raises(MazeTextEnvConfigError, match="mode"):
        _make(maze, {"mode": "chess"})
