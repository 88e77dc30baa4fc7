import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from maze_env import Action, Direction, generate
from maze_env.env import ENV_IDS, MazeEnv


def test_registered_ids_make_envs() -> None:
    for env_id in ENV_IDS:
        env = gym.make(env_id)
        obs, info = env.reset(seed=0)
        assert env.observation_space.contains(obs)
        assert info["optimal_moves"] == generate(env.unwrapped.spec_, 0).optimal_moves  # type: ignore[attr-defined]
    assert gym.make("mazerl/MazeHard-v0").reset(seed=1)[0].shape == (275, 275, 3)


def test_gymnasium_env_checker_passes() -> None:
    check_env(gym.make("mazerl/MazeEasy-v0").unwrapped, skip_render_check=False)
    check_env(MazeEnv("13x13:prim", render_mode="ansi", cell_px=8))


def test_episode_through_the_gym_api() -> None:
    env = MazeEnv("easy")
    obs, info = env.reset(seed=0)
    maze = env.maze
    assert info["agent"] == maze.start and info["distance"] == 12
    for i, d in enumerate(maze.optimal_actions):
        # Ints, Actions and text are all accepted.
        action = (
            int(d) if i % 3 == 0 else Action.move(d) if i % 3 == 1 else f"<action>{d.word}</action>"
        )
        obs, reward, terminated, truncated, info = env.step(action)
        assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["agent"] == maze.goal and info["distance"] == 0
    obs, reward, terminated, truncated, info = env.step(4)
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert tuple(obs[maze.goal[0] * 25 + 12, maze.goal[1] * 25 + 12]) == (0, 0, 255)


def test_feedback_and_parse_failures_in_info() -> None:
    env = MazeEnv("easy")
    env.reset(seed=0)
    _, _, _, _, info = env.step(int(Direction.UP))
    assert info["outcome"] == "bumped" and info["env_feedback"] == "Cannot move into a wall."
    _, _, _, _, info = env.step("hmm")
    assert info["outcome"] == "invalid" and info["parse_failure"] == "no_action"


def test_bad_actions_and_misuse_raise_gym_errors() -> None:
    env = MazeEnv("easy")
    with pytest.raises(gym.error.ResetNeeded):
        env.step(0)
    env.reset(seed=0)
    for bad in (5, -1, 2.0, None, True):
        with pytest.raises(gym.error.InvalidAction):
            env.step(bad)
    with pytest.raises(ValueError, match="render_mode"):
        MazeEnv(render_mode="human")


def test_options_maze_and_budget_and_truncation() -> None:
    env = MazeEnv("hard")
    maze = generate("hard", 9)
    _, info = env.reset(options={"maze": maze, "step_budget": 2})
    assert env.maze is maze and info["step_budget"] == 2
    env.step(0)
    _, _, terminated, truncated, _ = env.step(0)
    assert truncated and not terminated
    with pytest.raises(ValueError, match="renders"):
        env.reset(options={"maze": generate("easy", 0)})


def test_render_modes() -> None:
    env = MazeEnv("easy", render_mode="ansi")
    env.reset(seed=0)
    assert "A" in env.render() and "T" in env.render()
    env = MazeEnv("easy", cell_px=32)
    obs, _ = env.reset(seed=0)
    assert np.array_equal(env.render(), obs) and obs.shape == (288, 288, 3)
